"""Conformance: the quota ledger on every backend (seed 9: quota reserved in the database,
shared by every replica)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from typing import Any

import pytest
import trio

from daemon.core.quota import (
    Granted,
    QuotaPolicy,
    QuotaState,
    ReservationState,
    Wait,
    WindowKind,
)
from sandbox.quota_meter import QuotaMeter
from storage.port import SqlTx, WorkConflict
from storage.quota import reservation_move, reservation_open
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import T0

S = 1_000_000
POLICY = QuotaPolicy(limit=10, window_us=S, jitter_us=0)  # one slot every 100 ms


async def test_first_grant_creates_the_key_and_later_grants_are_spaced(store: WorkStore) -> None:
    first = await store.quota_grant("k", POLICY, now_us=T0)
    assert first == Granted((T0,), QuotaState(T0 + 100_000, 0))
    # Same instant: the next slot is 100 ms later, within max_wait it is granted ahead.
    second = await store.quota_grant("k", POLICY, now_us=T0, max_wait_us=S)
    assert isinstance(second, Granted) and second.slots == (T0 + 100_000,)
    # Without waiting: told exactly when to come back.
    assert await store.quota_grant("k", POLICY, now_us=T0) == Wait(T0 + 200_000)
    (view,) = await store.quota_keys()
    assert (view.quota_key, view.granted_total, view.interval_us) == ("k", 2, 100_000)
    # Independent keys do not share a budget.
    assert await store.quota_grant("other", POLICY, now_us=T0) == Granted(
        (T0,), QuotaState(T0 + 100_000, 0))


async def test_a_block_of_slots_costs_one_grant(store: WorkStore) -> None:
    got = await store.quota_grant("k", POLICY, now_us=T0, count=5)
    assert isinstance(got, Granted)
    assert got.slots == tuple(T0 + i * 100_000 for i in range(5))
    assert (await store.quota_keys())[0].granted_total == 5


async def test_a_throttle_blocks_the_key_for_everyone(store: WorkStore) -> None:
    await store.quota_grant("k", POLICY, now_us=T0)
    blocked = await store.quota_throttle("k", POLICY, now_us=T0, retry_after_us=10 * S)
    assert blocked.blocked_until_us == T0 + 10 * S
    assert await store.quota_grant("k", POLICY, now_us=T0 + S) == Wait(T0 + 10 * S)
    # A shorter Retry-After later never moves the block back.
    await store.quota_throttle("k", POLICY, now_us=T0 + S, retry_after_us=S)
    (view,) = await store.quota_keys()
    assert view.state.blocked_until_us == T0 + 10 * S
    assert (view.throttles_total, view.last_throttled_at_us) == (2, T0 + S)
    got = await store.quota_grant("k", POLICY, now_us=T0 + 10 * S)
    assert isinstance(got, Granted) and got.slots == (T0 + 10 * S,)


async def test_a_throttle_on_a_new_key_creates_it_blocked(store: WorkStore) -> None:
    await store.quota_throttle("fresh", POLICY, now_us=T0, retry_after_us=3 * S)
    assert await store.quota_grant("fresh", POLICY, now_us=T0) == Wait(T0 + 3 * S)


async def test_unused_newest_slots_come_back_once(store: WorkStore) -> None:
    got = await store.quota_grant("k", POLICY, now_us=T0, count=4)
    assert isinstance(got, Granted)
    assert await store.quota_return("k", POLICY, got.slots[2:], now_us=T0)
    assert not await store.quota_return("k", POLICY, got.slots[2:], now_us=T0)
    again = await store.quota_grant("k", POLICY, now_us=T0, max_wait_us=S)
    assert isinstance(again, Granted) and again.slots == (got.slots[2],)
    assert not await store.quota_return("nosuch", POLICY, (T0,), now_us=T0)


async def test_concurrent_grants_never_hand_out_one_slot_twice(store: WorkStore,
                                                             ) -> None:
    slots: list[int] = []
    roomy = QuotaPolicy(limit=1000, window_us=S, jitter_us=0)

    async def grab() -> None:
        for _ in range(10):
            got = await store.quota_grant("hot", roomy, now_us=T0, count=2, max_wait_us=60 * S)
            assert isinstance(got, Granted)
            slots.extend(got.slots)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(grab)
    assert len(slots) == len(set(slots)) == 160
    ordered = sorted(slots)
    assert all(b - a >= roomy.interval_us for a, b in itertools.pairwise(ordered))
    assert (await store.quota_keys())[0].granted_total == 160


# 4 at once, positions 100 ms apart, slot n no earlier than slot n - 10's entry + 1 s.
BURST = QuotaPolicy(limit=10, window_us=S, jitter_us=0, burst=4)
FIXED = QuotaPolicy(limit=10, window_us=S, jitter_us=0, kind=WindowKind.FIXED)


async def test_a_burst_starts_at_once_and_comes_back_by_position(store: WorkStore) -> None:
    step = BURST.interval_us
    got = await store.quota_grant("b", BURST, now_us=T0, count=5, max_wait_us=S)
    positions = tuple(T0 + i * step for i in range(5))
    # A new key's log: ten entries "a window before 0", then the positions.
    assert got == Granted((T0,) * 4 + (T0 + step,),
                          QuotaState(T0 + 5 * step, 0, (-S,) * 10 + positions), positions)
    assert await store.quota_grant("b", BURST, now_us=T0) == Wait(T0 + 2 * step)
    assert await store.quota_return("b", BURST, got.places[3:], now_us=T0)
    (view,) = await store.quota_keys("b")
    assert view.state == QuotaState(T0 + 3 * step, 0, (-S,) * 10 + positions[:3])
    again = await store.quota_grant("b", BURST, now_us=T0)
    assert isinstance(again, Granted) and again.slots == (T0,)


async def test_the_slot_log_holds_a_burst_until_the_window_allows_it(store: WorkStore) -> None:
    """A window's worth of slots (a burst of 4, then one per 100 ms): the GCRA alone would
    start the next 4 at once a second later; the row's log starts each one a whole window
    after the entry (the position) of the slot 10 before it."""
    step = BURST.interval_us
    first = await store.quota_grant("l", BURST, now_us=T0, count=10, max_wait_us=2 * S)
    assert isinstance(first, Granted)
    later = T0 + 10 * step  # the TAT: the GCRA's tolerance would allow 4 at once now
    nxt = await store.quota_grant("l", BURST, now_us=later, count=4, max_wait_us=2 * S)
    assert isinstance(nxt, Granted)
    assert first.slots[:4] == (T0,) * 4  # the burst
    assert nxt.slots == tuple(p + S for p in first.places[:4]) == tuple(
        later + i * step for i in range(4))
    everything = [*first.slots, *nxt.slots]
    assert max(sum(1 for t in everything if a <= t < a + S) for a in everything) <= 10


async def test_an_unreadable_or_missing_slot_log_only_delays(store: WorkStore) -> None:
    """A row whose log cannot be read (or a key that ran without one: the GCRA's path
    writes NULL) is taken as a history as late as it could have been: the next slot
    waits a window, never starts early."""
    plain = QuotaPolicy(limit=10, window_us=S, jitter_us=0)  # no burst: no log
    got = await store.quota_grant("u", plain, now_us=T0, count=3)
    assert isinstance(got, Granted) and got.state.log == ()
    (view,) = await store.quota_keys("u")
    assert view.state.log == ()
    tat = view.state.tat_us
    logged = await store.quota_grant("u", BURST, now_us=T0, max_wait_us=2 * S)
    assert isinstance(logged, Granted) and logged.slots == (tat + S,)

    async def spoil(tx: SqlTx) -> None:
        await tx.execute("UPDATE quota_keys SET slot_log = 'not,a,log' WHERE quota_key = ?",
                         ("u",))

    await store.db.transact(spoil, name="test.spoil")
    (view,) = await store.quota_keys("u")
    assert view.state.log == ()
    again = await store.quota_grant("u", BURST, now_us=T0, max_wait_us=3 * S)
    assert isinstance(again, Granted)
    assert again.slots[0] >= max(view.state.tat_us, T0) + S
    (view,) = await store.quota_keys("u")
    assert len(view.state.log) == BURST.limit + 1  # readable again


async def test_a_fixed_window_counts_per_window(store: WorkStore) -> None:
    window = FIXED.window_start(T0)
    got = await store.quota_grant("f", FIXED, now_us=T0, count=10)
    assert isinstance(got, Granted) and got.slots == (T0,) * 10
    assert got.state == QuotaState(window + 10, 0)
    assert await store.quota_grant("f", FIXED, now_us=T0) == Wait(window + S)
    nxt = await store.quota_grant("f", FIXED, now_us=T0, max_wait_us=S)
    assert isinstance(nxt, Granted) and nxt.slots == (window + S,)
    assert (await store.quota_keys("f"))[0].granted_total == 11


@pytest.mark.parametrize("policy", [
    BURST, FIXED, QuotaPolicy(limit=1_500, window_us=100 * S, jitter_us=0, burst=40)],
    ids=["sliding_burst", "fixed", "stretched_burst"])
async def test_concurrent_grants_with_bursts_never_exceed_a_window(store: WorkStore,
                                                                   policy: QuotaPolicy) -> None:
    """Eight tasks on one pool race for one key over many windows (every grant path: the
    slot log's and the fixed window's compare-and-swap, the one-statement UPDATE)."""
    slots: list[int] = []

    async def grab() -> None:
        for _ in range(6):
            got = await store.quota_grant("hot", policy, now_us=T0, count=2,
                                          max_wait_us=60 * S)
            assert isinstance(got, Granted)
            slots.extend(got.slots)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(grab)
    assert len(slots) == 96
    ordered = sorted(slots)
    if policy.kind is WindowKind.FIXED:
        per_window: dict[int, int] = {}
        for t in ordered:
            per_window[policy.window_start(t)] = per_window.get(policy.window_start(t), 0) + 1
        assert max(per_window.values()) == policy.limit
    else:
        j = 0
        for i, start in enumerate(ordered):
            while j < len(ordered) and ordered[j] < start + policy.window_us:
                j += 1
            assert j - i <= policy.limit
    assert (await store.quota_keys("hot"))[0].granted_total == 96


async def test_a_remaining_count_moves_the_budget_forward_never_back(store: WorkStore) -> None:
    step = BURST.interval_us
    await store.quota_grant("r", BURST, now_us=T0)
    # The provider says 1 remains: one slot now, then the sustained rate.
    assert await store.quota_correct("r", BURST, now_us=T0, remaining=1)
    assert isinstance(await store.quota_grant("r", BURST, now_us=T0), Granted)
    assert await store.quota_grant("r", BURST, now_us=T0) == Wait(T0 + step)
    # Saying more remain than the row grants never moves it back.
    (before,) = await store.quota_keys("r")
    assert not await store.quota_correct("r", BURST, now_us=T0, remaining=3)
    assert not await store.quota_correct("r", BURST, now_us=T0, remaining=9)
    (after,) = await store.quota_keys("r")
    assert after.state == before.state
    # An unknown key is not created by a header.
    assert not await store.quota_correct("nosuch", BURST, now_us=T0, remaining=0)
    assert await store.quota_keys("nosuch") == []


async def test_reservations_move_once_out_of_reserved(store: WorkStore) -> None:
    async def open_two(tx: SqlTx) -> tuple[str, str]:
        a = await reservation_open(tx, quota_key="k", slot_at_us=T0, expires_at_us=T0 + 1,
                                   work_id="W1", ownership_epoch=3, now_us=T0)
        b = await reservation_open(tx, quota_key="k", slot_at_us=T0 + 5, expires_at_us=T0 + 6,
                                   work_id="W1", ownership_epoch=3, now_us=T0)
        return a, b

    a, b = await store.db.transact(open_two, name="test")

    async def move(rid: str, target: ReservationState, attempt: str | None = None) -> None:
        async def body(tx: SqlTx) -> None:
            await reservation_move(tx, rid, target, now_us=T0, attempt_id=attempt)
        await store.db.transact(body, name="test")

    await move(a, ReservationState.SENT, "A1")
    await move(a, ReservationState.SENT)  # idempotent
    await move(b, ReservationState.SPENT_UNKNOWN, "A2")
    for rid, target in ((a, ReservationState.RELEASED), (b, ReservationState.SENT),
                        (b, ReservationState.RESERVED)):
        with pytest.raises(WorkConflict, match="cannot become"):
            await move(rid, target)
    with pytest.raises(WorkConflict, match="no quota reservation"):
        await move("nosuch", ReservationState.SENT)
    got = {(r.reservation_id, r.state, r.attempt_id) for r in await store.quota_reservations("W1")}
    assert got == {(a, ReservationState.SENT, "A1"), (b, ReservationState.SPENT_UNKNOWN, "A2")}


@pytest.mark.slow
async def test_replicas_sharing_one_key_never_exceed_the_providers_window(
        database: FreshDatabase, store: WorkStore) -> None:
    """Seed 13: replica scaling does not multiply quota. Four OS processes draw on one key
    and send to a real provider stand-in that counts arrivals in its own windows; 100
    other keys run beside it. The meter sees no window over the limit and no 429."""
    limit, window = 20, 1.0
    meter = QuotaMeter(limit, window)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(meter.run)
        start_at = time.time() + 1.5
        spec = {"url": database.url, "start_at": start_at, "duration": 3.0, "limit": limit,
                "window": window, "jitter": 0.25, "block": 2, "max_wait": 0.5,
                "meter": f"http://127.0.0.1:{port}"}
        hot = [{**spec, "owner": f"hot{i}", "keys": ["hot"]} for i in range(4)]
        cold = [{**spec, "owner": "cold", "keys": [f"cold{i}" for i in range(100)]}]
        results = await _run_racers([*hot, *cold])
        nursery.cancel_scope.cancel()
    report = meter.report()
    assert report["violations"] == 0 and report["throttled"] == 0, report
    keys = report["keys"]
    assert isinstance(keys, dict)
    hot_sends = sum(r["sends"] for r in results[:4])
    assert keys["hot"]["arrivals"] == hot_sends > 0
    # Four replicas together got no more than one replica's share of the provider
    # (racers that started late stretch the run: allow for the spread of their starts).
    assert hot_sends <= limit * ((3.0 + max(r["late_s"] for r in results)) / window + 1)
    assert all(r["statuses"].keys() <= {"200"} for r in results)
    assert (await store.quota_keys("hot"))[0].granted_total >= hot_sends


async def _run_racers(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    procs = [await trio.lowlevel.open_process(
        [sys.executable, "-m", "sandbox.quota_racer", json.dumps(s)],
        stdout=subprocess.PIPE) for s in specs]
    results = []
    with trio.fail_after(60):
        for proc in procs:
            assert proc.stdout is not None
            data = b""
            async for chunk in proc.stdout:
                data += chunk
            assert await proc.wait() == 0
            results.append(json.loads(data))
    return results


async def test_quota_waiters_are_the_oldest_held_items_read_by_index(store: WorkStore) -> None:
    """The Quota page's "what is waiting on each key" reads the oldest held items by work
    id, an index order, not the ones due soonest: ordering by run_after sorted every held
    item to show a page of them (50,000 at 1M open items, issue 23)."""
    from daemon.core.outcomes import Deferred
    from daemon.services.effect_quota import waiting_summary
    from tests.support.work import claim, enqueue, finalize

    ids = []
    for k in range(3):  # created a second apart
        ids += await enqueue(store, 1, now=T0 + k * S)
    items = {i.work_id: i for i in (await claim(store, now=T0 + 5 * S, limit=3)).claimed}
    for k, work_id in enumerate(ids):  # the newest item is due soonest
        await finalize(store, items[work_id], Deferred(
            "quota_wait", T0 + (100 - k) * S, waiting_summary("p:key", 1.0)), now=T0 + 5 * S)
    waiters = await store.quota_waiters(2)
    assert [w.work_id for w in waiters] == ids[:2]
    assert all(len(w.journal) == 1 for w in waiters)
    # Per key: a range of the quota_wait_key index (migration 0045), oldest first.
    assert [w.work_id for w in await store.quota_waiters(2, ["p:key"])] == ids[:2]
    assert await store.quota_waiters(2, ["p:other"]) == []


async def test_quota_waiting_counts_per_key_come_from_the_held_items_key_and_stop_at_a_cap(
        store: WorkStore) -> None:
    """The per-key waiting count (the Quota page, integrationd_quota_waiting_work) is a
    range of the index on the key the held item's summary names (migration 0045), not a
    read of every held item's summary (1.6 s at 50,000 held items, issue 23); it stops at
    its cap and says "more". An item that leaves quota_wait leaves the count."""
    from daemon.core.outcomes import Deferred, RetryLater
    from daemon.services.effect_quota import waiting_summary
    from storage.bounded import BoundedCount
    from tests.support.work import claim, enqueue, finalize

    await enqueue(store, 4, now=T0)
    items = (await claim(store, now=T0 + S, limit=4)).claimed
    for item, key in zip(items, ["p:a", "p:a", "p:b:with:colons", "p:a"], strict=True):
        await finalize(store, item, Deferred("quota_wait", T0 + 100 * S,
                                             waiting_summary(key, 1.5)), now=T0 + S)
    keys = ["p:a", "p:b:with:colons", "p:none"]
    assert await store.quota_waiting_counts(keys) == {
        "p:a": BoundedCount(3), "p:b:with:colons": BoundedCount(1), "p:none": BoundedCount(0)}
    capped = await store.quota_waiting_counts(keys, cap=2)
    assert capped["p:a"] == BoundedCount(2, more=True) and capped["p:a"].text() == "more than 2"
    assert capped["p:b:with:colons"] == BoundedCount(1)
    # Claimed again and retried for another reason: no longer held on its key.
    (again,) = (await claim(store, now=T0 + 200 * S, limit=1)).claimed
    await finalize(store, again, RetryLater("transport", "x"), now=T0 + 200 * S)
    counts = await store.quota_waiting_counts(keys)
    assert counts["p:a"].n + counts["p:b:with:colons"].n == 3
