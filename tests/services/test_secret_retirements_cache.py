"""The ingress verifier's view of retired previous secrets (daemon/services/
secret_retirements.py) under trio's MockClock: read from the database at most once per
TTL, a retirement once known kept for good (even with the database gone), a database
that fails or hangs bounded by the deadline and never taken for a retirement, and the
previous-secret gauge set from every load."""

from __future__ import annotations

import trio
import trio.testing

from daemon.services.secret_retirements import Key, SecretRetirements
from storage.port import StorageError


class Source:
    """What the database says (a test double of the one read; the real read is
    exercised in tests/services/test_secret_retirement.py on every backend)."""

    def __init__(self) -> None:
        self.retired: set[Key] = set()
        self.loads = 0
        self.fail = False
        self.hang = False

    async def load(self) -> set[Key]:
        self.loads += 1
        if self.hang:
            await trio.sleep_forever()
        if self.fail:
            raise StorageError("database unavailable")
        return set(self.retired)


async def test_read_at_most_once_per_ttl_and_a_retirement_is_kept(
        autojump_clock: trio.testing.MockClock) -> None:
    source = Source()
    gauge: list[tuple[str, bool]] = []
    cache = SecretRetirements(source.load, watched=frozenset({("r", 2)}), ttl_s=1.0,
                              on_state=lambda route, accepted: gauge.append((route, accepted)))
    assert not await cache.retired("r", 2)
    assert not await cache.retired("r", 2)
    assert source.loads == 1  # within the TTL: no second read
    source.retired.add(("r", 2))
    assert not await cache.retired("r", 2)  # not yet re-read
    await trio.sleep(1.0)
    assert await cache.retired("r", 2)
    assert source.loads == 2
    assert gauge == [("r", True), ("r", False)]
    # Known retired: no more reads, and a database gone changes nothing.
    source.fail = True
    await trio.sleep(5.0)
    assert await cache.retired("r", 2)
    assert source.loads == 2
    # Another generation of the route is another secret: not retired.
    assert not await cache.retired("r", 3)


async def test_a_failing_or_hanging_database_is_bounded_and_not_a_retirement(
        autojump_clock: trio.testing.MockClock) -> None:
    source = Source()
    source.retired.add(("r", 2))
    source.fail = True
    cache = SecretRetirements(source.load, watched=frozenset({("r", 2)}), ttl_s=1.0,
                              deadline_s=0.5)
    assert not await cache.retired("r", 2)  # cannot judge: still accepted
    assert not await cache.retired("r", 2)
    assert source.loads == 2  # a failed read is tried again at once, not cached
    source.fail, source.hang = False, True
    started = trio.current_time()
    assert not await cache.retired("r", 2)
    assert trio.current_time() - started <= 0.5 + 1e-6  # bounded by the deadline
    source.hang = False
    assert await cache.retired("r", 2)


async def test_the_refresher_keeps_the_gauge_and_idles_without_watched_routes(
        autojump_clock: trio.testing.MockClock) -> None:
    source = Source()
    gauge: list[tuple[str, bool]] = []
    cache = SecretRetirements(source.load, watched=frozenset({("r", 2)}), ttl_s=1.0,
                              on_state=lambda route, accepted: gauge.append((route, accepted)))
    async with trio.open_nursery() as nursery:
        await nursery.start(cache.run)
        await trio.sleep(2.5)
        source.retired.add(("r", 2))
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    assert gauge[0] == ("r", True) and gauge[-1] == ("r", False)
    assert source.loads == 4
    idle = Source()
    quiet = SecretRetirements(idle.load)  # no route has a previous secret
    async with trio.open_nursery() as nursery:
        await nursery.start(quiet.run)
        await trio.sleep(10.0)
    assert idle.loads == 0
