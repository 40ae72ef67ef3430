"""Conformance: enqueue idempotency, cancel, replay with lineage, depths, listing."""

from __future__ import annotations

import json

import pytest
import trio

from daemon.core.outcomes import CancelAcknowledged, DeadLetter, Succeeded
from daemon.core.states import WorkState
from storage.port import ReplayParams, WorkConflict, WorkNotFound, WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import SEC, T0, TTL, claim, enqueue, finalize, spec


async def test_dedupe_key_makes_enqueue_idempotent(store: WorkStore) -> None:
    first = await store.work_enqueue([spec(dedupe_key="cmd-1")], T0)
    again = await store.work_enqueue([spec(dedupe_key="cmd-1"), spec(dedupe_key="cmd-2")], T0)
    assert first[0].created and not again[0].created and again[1].created
    assert again[0].work_id == first[0].work_id
    assert await store.work_count_open() == 2


async def test_cancel_unclaimed_work_directly(store: WorkStore) -> None:
    (wid,) = await enqueue(store)
    result = await store.work_cancel(wid, T0)
    assert (result.disposition, result.state) == ("cancelled", WorkState.CANCELLED)
    assert (await claim(store)).claimed == []


async def test_cancel_running_work_is_acknowledged_by_its_claimant(store: WorkStore) -> None:
    (wid,) = await enqueue(store)
    (item,) = (await claim(store)).claimed
    result = await store.work_cancel(wid, T0)
    assert result.disposition == "requested"
    renew = await store.work_renew_if_owner([item.fence], TTL, lambda: T0 + SEC)  # type: ignore[list-item]
    assert renew.cancel_requested == [item.fence]
    ack = await finalize(store, item, CancelAcknowledged(), now=T0 + SEC)
    assert ack.applied and ack.state is WorkState.CANCELLED


async def test_cancel_unknown_item(store: WorkStore) -> None:
    with pytest.raises(WorkNotFound):
        await store.work_cancel("01NOSUCHITEM00000000000000", T0)


async def _dead_item(store: WorkStore) -> str:
    (wid,) = await enqueue(store, payload='{"k":1}', source_lane="L", target_lane="T")
    (item,) = (await claim(store)).claimed
    await finalize(store, item, DeadLetter("bad", "provider said no"))
    return wid


async def test_replay_creates_new_work_with_lineage_and_audit(store: WorkStore) -> None:
    wid = await _dead_item(store)
    new = await store.work_replay(
        ReplayParams(work_id=wid, actor="alice", role="operator", reason="provider fixed"), T0
    )
    assert new.work_id != wid and new.replay_of == wid
    assert (new.state, new.attempt, new.ownership_epoch) == (WorkState.PENDING, 0, 0)
    assert (new.payload, new.source_lane, new.target_lane) == ('{"k":1}', "L", "T")
    assert new.source_seq == 2
    old = await store.work_get(wid)
    assert old is not None and old.state is WorkState.DEAD  # history untouched
    (entry,) = await store.audit_list(target_id=wid)
    assert (entry.actor, entry.role, entry.action, entry.reason) == (
        "alice", "operator", "work.replay", "provider fixed")
    assert json.loads(entry.after)["work_id"] == new.work_id
    (claimed,) = (await claim(store)).claimed
    assert claimed.work_id == new.work_id


async def test_replay_of_live_work_is_refused(store: WorkStore) -> None:
    (wid,) = await enqueue(store)
    params = ReplayParams(work_id=wid, actor="a", role="operator", reason="r")
    with pytest.raises(WorkConflict, match="only terminal"):
        await store.work_replay(params, T0)
    await claim(store)
    with pytest.raises(WorkConflict, match="only terminal"):
        await store.work_replay(params, T0)
    with pytest.raises(WorkNotFound):
        await store.work_replay(
            ReplayParams(work_id="01NOSUCH0000000000000000000", actor="a", role="o",
                         reason="r"), T0)
    assert await store.audit_list() == []


async def test_racing_replays_have_one_winner(database: FreshDatabase) -> None:
    stores = [await database.open_store(pool_size=2) for _ in range(4)]
    wid = await _dead_item(stores[0])
    outcomes: list[str] = []

    async def replay(store: WorkStore, actor: str) -> None:
        try:
            await store.work_replay(
                ReplayParams(work_id=wid, actor=actor, role="operator", reason="r"), T0)
            outcomes.append("won")
        except WorkConflict as exc:
            outcomes.append("conflict" if "already replayed" in str(exc) else str(exc))

    async with trio.open_nursery() as nursery:
        for i, s in enumerate(stores):
            nursery.start_soon(replay, s, f"op{i}")
    assert sorted(outcomes) == ["conflict"] * 3 + ["won"]
    assert len(await stores[0].audit_list(target_id=wid)) == 1
    replays = [i for i in await stores[0].work_list(WorkQuery()) if i.replay_of == wid]
    assert len(replays) == 1


async def test_depths_and_listing(store: WorkStore) -> None:
    await enqueue(store, 3, org_id="o1")
    await enqueue(store, 2, family="other", org_id="o2", run_after_us=T0 - 5 * SEC)
    (item,) = (await claim(store, limit=1)).claimed
    await finalize(store, item, DeadLetter("x"))
    depths = {(d.family, d.state): d for d in await store.work_depths()}
    assert depths[("noop", WorkState.PENDING)].count == 2
    assert depths[("noop", WorkState.DEAD)].count == 1
    assert depths[("other", WorkState.PENDING)].count == 2
    assert depths[("other", WorkState.PENDING)].oldest_run_after_us == T0 - 5 * SEC
    assert ("noop", WorkState.SUCCEEDED) not in depths

    everything = await store.work_list(WorkQuery(limit=10))
    assert [i.work_id for i in everything] == sorted((i.work_id for i in everything),
                                                     reverse=True)
    assert len(await store.work_list(WorkQuery(org_id="o2"))) == 2
    assert len(await store.work_list(WorkQuery(state=WorkState.DEAD))) == 1
    page1 = await store.work_list(WorkQuery(limit=2))
    page2 = await store.work_list(WorkQuery(limit=10, after_id=page1[-1].work_id))
    assert {i.work_id for i in page1}.isdisjoint({i.work_id for i in page2})
    assert len(page1) + len(page2) == 5


async def test_succeeded_journal_counts(store: WorkStore) -> None:
    await enqueue(store, 3)
    for item in (await claim(store)).claimed:
        await finalize(store, item, Succeeded())
    assert await store.work_execution_totals("noop") == (3, 3)
