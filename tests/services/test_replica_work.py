"""The replica's services under trio's MockClock: schedulers, lease keeper, completer, drain.

These run on a real SQLite database (inline statements, no worker threads, so
MockClock's autojump sees every wait).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
import trio

from config.settings import FamilySettings
from daemon.core.outcomes import Outcome, Succeeded
from daemon.core.states import WorkState
from daemon.services.families import WorkContext
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import fresh_database
from tests.support.harness import SwitchableDatabase, running_replica, settings, wait_for
from tests.support.work import spec


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[WorkStore]:
    async with fresh_database("sqlite", tmp_path) as tdb:
        yield await tdb.open_store()


def now_us() -> int:
    from daemon.services.clock import TrioClock

    return TrioClock().now_us()


async def enqueue(store: WorkStore, n: int = 1, **kw: object) -> list[str]:
    results = await store.work_enqueue([spec(**kw) for _ in range(n)], now_us())
    return [r.work_id for r in results]


async def states(store: WorkStore) -> dict[str, WorkState]:
    return {i.work_id: i.state for i in await store.work_list(WorkQuery(limit=1000))}


async def test_replica_runs_work_to_completion(store: WorkStore, autojump_clock: object) -> None:
    ids = await enqueue(store, 300, org_id="o1")
    async with running_replica(store, settings()) as replica:
        await wait_for(lambda: _zero(store.work_count_open()))
        assert replica.metrics.claimed.labels("noop")._value.get() == 300
    assert set((await states(store)).values()) == {WorkState.SUCCEEDED}
    assert await store.work_execution_totals("noop") == (300, 300)
    assert len(ids) == 300


async def _zero(count: Awaitable[int]) -> bool:
    return await count == 0


async def test_lease_keeper_keeps_long_work_alive(store: WorkStore, autojump_clock: object
                                                  ) -> None:
    async def slow(ctx: WorkContext) -> Outcome:
        await trio.sleep(120)  # four lease TTLs
        return Succeeded()

    (wid,) = await enqueue(store, family="slow")
    cfg = settings({"slow": FamilySettings(lease_ttl=30)})
    async with running_replica(store, cfg, {"slow": slow}):
        await wait_for(lambda: _state_is(store, wid, WorkState.SUCCEEDED))
    (execution,) = await store.work_executions(wid)
    assert execution.ownership_epoch == 1  # never lost, never reclaimed


async def _state_is(store: WorkStore, wid: str, state: WorkState) -> bool:
    item = await store.work_get(wid)
    return item is not None and item.state is state


async def test_stale_replica_stops_when_another_takes_the_lease(
    store: WorkStore, autojump_clock: object
) -> None:
    stopped = trio.Event()

    async def forever(ctx: WorkContext) -> Outcome:
        try:
            await trio.sleep_forever()
        finally:
            stopped.set()

    (wid,) = await enqueue(store, family="forever")
    cfg = settings({"forever": FamilySettings(lease_ttl=30)})
    async with running_replica(store, cfg, {"forever": forever}) as replica:
        await wait_for(lambda: _state_is(store, wid, WorkState.PROCESSING))
        # Another replica reclaims it (new token, higher epoch).
        await store.db.transact(
            lambda tx: tx.execute(
                "UPDATE work_items SET lease_token = 'another', lease_owner = 'replica-2',"
                " ownership_epoch = ownership_epoch + 1 WHERE work_id = ?", (wid,)),
            name="t",
        )
        with trio.fail_after(60):
            await stopped.wait()
        assert replica.metrics.lease_lost.labels("forever")._value.get() == 1
    item = await store.work_get(wid)
    assert item is not None
    assert (item.state, item.lease_owner, item.ownership_epoch) == (
        WorkState.PROCESSING, "replica-2", 2)
    assert await store.work_executions(wid) == []


async def test_unreachable_database_stops_work_at_the_trust_horizon_then_resumes(
    store: WorkStore, autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[tuple[int, str, float]] = []

    async def long_once(ctx: WorkContext) -> Outcome:
        runs.append((ctx.fence.ownership_epoch, "started", trio.current_time()))
        if ctx.fence.ownership_epoch == 1:
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                runs.append((1, "cancelled", trio.current_time()))
                raise
        return Succeeded()

    switch = SwitchableDatabase(store.db)
    flaky = WorkStore(switch, store.dialect)
    (wid,) = await enqueue(store, family="long")
    cfg = settings({"long": FamilySettings(lease_ttl=20)}, lease_margin=5.0)
    async with running_replica(flaky, cfg, {"long": long_once}) as replica:
        await wait_for(lambda: runs)
        switch.down = True
        await wait_for(lambda: any(r[1] == "cancelled" for r in runs))
        started = runs[0][2]
        cancelled = next(r[2] for r in runs if r[1] == "cancelled")
        # Stopped no later than claim + ttl - margin: before anyone could reclaim.
        assert cancelled - started <= 15.0 + 1e-6
        assert not replica.readiness()[0]
        await trio.sleep(30)  # the outage goes on; nothing crashes
        switch.down = False
        await wait_for(lambda: _state_is(store, wid, WorkState.SUCCEEDED))
        await wait_for(lambda: replica.readiness()[0])
        # The stopped execution is in the journal: its lease was reclaimed (here by
        # the same replica, once the database came back), and counted.
        assert replica.metrics.reclaimed.labels("long")._value.get() == 1
    assert [(e.ownership_epoch, e.outcome, e.replica, e.reclaimed_by)
            for e in await store.work_executions(wid)] == [
        (1, "lease_lost", replica.replica_id, replica.replica_id),
        (2, "succeeded", replica.replica_id, None)]
    (logged,) = [r for r in caplog.records if r.getMessage() == "work_lease_reclaimed"]
    assert logged.fields == {  # type: ignore[attr-defined]
        "family": "long", "work_id": wid, "superseded_epoch": 1, "attempt": 1,
        "previous_owner": replica.replica_id, "reclaimed_by": replica.replica_id,
        "disposition": "reclaimed"}


async def test_operator_cancel_is_acknowledged(store: WorkStore, autojump_clock: object) -> None:
    async def forever(ctx: WorkContext) -> Outcome:
        await trio.sleep_forever()

    (wid,) = await enqueue(store, family="forever")
    cfg = settings({"forever": FamilySettings(lease_ttl=30)})
    async with running_replica(store, cfg, {"forever": forever}):
        await wait_for(lambda: _state_is(store, wid, WorkState.PROCESSING))
        result = await store.work_cancel(wid, now_us())
        assert result.disposition == "requested"
        await wait_for(lambda: _state_is(store, wid, WorkState.CANCELLED))
    (execution,) = await store.work_executions(wid)
    assert execution.outcome == "cancelled"


async def test_drain_finishes_short_work_and_releases_the_rest(
    store: WorkStore, autojump_clock: object
) -> None:
    async def sized(ctx: WorkContext) -> Outcome:
        await trio.sleep(json.loads(ctx.item.payload)["s"])
        return Succeeded()

    quick = await enqueue(store, 3, family="sized", payload='{"s": 2}')
    slow = await enqueue(store, 2, family="sized", payload='{"s": 1000}')
    cfg = settings({"sized": FamilySettings(lease_ttl=60)}, drain=10.0)
    async with running_replica(store, cfg, {"sized": sized}) as replica:
        await wait_for(lambda: replica.pool is not None and len(replica.pool.flights) == 5)
    # The context manager drained: quick work finished, slow work was released.
    now = await states(store)
    assert {now[w] for w in quick} == {WorkState.SUCCEEDED}
    assert {now[w] for w in slow} == {WorkState.RETRY}
    for wid in slow:
        item = await store.work_get(wid)
        assert item is not None and item.attempt == 0 and item.failure_class == "released"


async def test_retries_back_off_then_succeed(store: WorkStore, autojump_clock: object) -> None:
    (wid,) = await enqueue(store, payload='{"fail_attempts": 2}', max_attempts=5)
    cfg = settings({"noop": FamilySettings(backoff_base=4.0, backoff_cap=60.0)})
    async with running_replica(store, cfg):
        await wait_for(lambda: _state_is(store, wid, WorkState.SUCCEEDED))
    executions = await store.work_executions(wid)
    assert [(e.attempt, e.outcome) for e in executions] == [
        (1, "retry"), (2, "retry"), (3, "succeeded")]
    # Full jitter: the second retry waited at most base * 2 after the first.
    gaps = [b.finished_at_us - a.finished_at_us for a, b in itertools.pairwise(executions)]
    assert all(0 < g <= 8_500_000 + 1_000_000 for g in gaps)


async def test_spent_attempts_dead_letter(store: WorkStore, autojump_clock: object) -> None:
    (wid,) = await enqueue(store, payload='{"fail_attempts": 99}', max_attempts=3)
    cfg = settings({"noop": FamilySettings(backoff_base=0.5, backoff_cap=1.0)})
    async with running_replica(store, cfg):
        await wait_for(lambda: _state_is(store, wid, WorkState.DEAD))
    item = await store.work_get(wid)
    assert item is not None and item.attempt == 3
    assert item.operator_summary is not None and "attempts exhausted (3)" in item.operator_summary


async def test_handler_errors_are_retried_without_their_message(
    store: WorkStore, autojump_clock: object
) -> None:
    async def broken(ctx: WorkContext) -> Outcome:
        raise ValueError("token=sk_live_123 leaked into an exception")

    (wid,) = await enqueue(store, family="broken", max_attempts=1)
    async with running_replica(store, settings(), {"broken": broken}):
        await wait_for(lambda: _state_is(store, wid, WorkState.DEAD))
    item = await store.work_get(wid)
    assert item is not None and item.failure_class == "handler_error"
    assert item.operator_summary is not None
    assert "ValueError" in item.operator_summary
    assert "sk_live" not in item.operator_summary


async def test_source_lane_runs_in_order_and_target_lane_never_overlaps(
    store: WorkStore, autojump_clock: object
) -> None:
    order: list[str] = []
    holders: dict[str, int] = {}
    worst: dict[str, int] = {}

    async def record(ctx: WorkContext) -> Outcome:
        lane = ctx.item.target_lane or ""
        holders[lane] = holders.get(lane, 0) + 1
        worst[lane] = max(worst.get(lane, 0), holders[lane])
        await trio.sleep(0.5)
        holders[lane] -= 1
        if ctx.item.source_lane == "S":
            order.append(ctx.item.subject_id)
        return Succeeded()

    for i in range(12):
        await enqueue(store, family="rec", subject_id=f"s{i:02}", source_lane="S")
    await enqueue(store, 12, family="rec", target_lane="T1")
    await enqueue(store, 12, family="rec", target_lane="T2")
    cfg = settings({"rec": FamilySettings(batch_size=16, concurrency=16)})
    async with running_replica(store, cfg, {"rec": record}):
        await wait_for(lambda: _zero(store.work_count_open()))
    assert order == [f"s{i:02}" for i in range(12)]
    assert worst["T1"] == 1 and worst["T2"] == 1


async def test_small_org_is_not_starved_by_a_big_backlog(
    store: WorkStore, autojump_clock: object
) -> None:
    done: list[str] = []

    async def record(ctx: WorkContext) -> Outcome:
        await trio.sleep(0.1)
        done.append(ctx.item.org_id)
        return Succeeded()

    await enqueue(store, 400, family="rec", org_id="big")
    await enqueue(store, 5, family="rec", org_id="small")
    cfg = settings({"rec": FamilySettings(batch_size=8, concurrency=8)})
    async with running_replica(store, cfg, {"rec": record}):
        await wait_for(lambda: done.count("small") == 5)
        # All of the small org's work finished while most of the backlog waited.
        assert len(done) < 100


async def test_a_replica_leaves_work_written_for_a_newer_engine(
    store: WorkStore, autojump_clock: object
) -> None:
    (newer,) = await enqueue(store, engine_capability_version=2)
    (schema,) = await enqueue(store, payload_schema_version=2)
    (current,) = await enqueue(store)
    async with running_replica(store, settings()) as replica:
        await wait_for(lambda: _state_is(store, current, WorkState.SUCCEEDED))
        await trio.sleep(60)  # many polls and reclaim sweeps later
        assert replica.metrics.claimed.labels("noop")._value.get() == 1
    for wid in (newer, schema):
        item = await store.work_get(wid)
        assert item is not None and (item.state, item.attempt) == (WorkState.PENDING, 0)
        assert await store.work_executions(wid) == []


async def test_a_lost_claim_commit_reply_does_not_strand_the_batch(
    store: WorkStore, autojump_clock: object
) -> None:
    """Finding (issue 13): when the claim's COMMIT reply was lost while the database
    was going away, the replica dropped the batch until lease expiry (one attempt
    lost per item). It reads back the rows carrying its token once it can, and runs
    them under the claim it made."""
    switch = SwitchableDatabase(store.db)
    flaky = WorkStore(switch, store.dialect)
    ids = await enqueue(store, 5)
    switch.lose_reply("work.claim", outage_s=2.0)
    async with running_replica(flaky, settings({"noop": FamilySettings(lease_ttl=30)})) as r:
        await wait_for(lambda: _zero(store.work_count_open()))
        assert r.metrics.reclaimed.labels("noop")._value.get() == 0
    for wid in ids:
        item = await store.work_get(wid)
        assert item is not None and (item.state, item.attempt, item.ownership_epoch) == (
            WorkState.SUCCEEDED, 1, 1)
        assert [e.outcome for e in await store.work_executions(wid)] == ["succeeded"]
