"""Conformance: owner generations, cutover receipts and the rollback fence (seed 11.1)."""

from __future__ import annotations

import json

import attrs
import pytest

from daemon.core.cutover import Claimant, IllegalStep, Phase
from daemon.core.outcomes import Released
from sandbox.legacy import store as legacy
from storage.cutover.steps import NotUnderCutover
from storage.cutover.values import CutoverBlocked
from storage.port import ClaimParams, ReplicaInfo, SqlTx
from storage.work_store import WorkStore
from tests.support.cutover import params, states
from tests.support.legacy import sandbox_claimant
from tests.support.work import SEC, T0, TTL, claim, enqueue, finalize

PROBE = sandbox_claimant()


def _codes(exc: pytest.ExceptionInfo[CutoverBlocked]) -> list[str]:
    return [b.code for b in exc.value.blockers]


async def _cut_over(store: WorkStore, now: int = T0) -> None:
    await store.cutover_begin(params(), now)
    await store.cutover_commit(params(), now, PROBE)


async def test_a_family_without_a_generation_claims_as_before(store: WorkStore) -> None:
    await enqueue(store, 1)
    assert await store.owner_generation_get("noop") is None
    assert len((await claim(store)).claimed) == 1


async def test_begin_stops_claims_until_commit_writes_the_receipt(store: WorkStore) -> None:
    await legacy.install(store)
    await enqueue(store, 2)
    result = await store.cutover_begin(params(), T0)
    assert result.generation.phase is Phase.CUTOVER_DRAINING
    assert result.generation.claimant is Claimant.NONE
    assert (await claim(store)).claimed == []  # the claim statement itself refuses
    committed = await store.cutover_commit(params(), T0 + SEC, PROBE)
    assert committed.receipt is not None
    assert committed.generation.generation == committed.receipt.generation == 1
    assert committed.generation.receipt_id == committed.receipt.receipt_id
    assert committed.receipt.owner == "integrationd" and committed.receipt.kind == "cutover"
    proof = json.loads(committed.receipt.proof_json)
    assert proof["legacy_processing"] == 0 and proof["legacy_uncovered"] == 0
    assert len((await claim(store, now=T0 + SEC)).claimed) == 2
    audit = [e.action for e in await store.audit_list(target_id="noop")]
    assert audit == ["cutover.commit", "cutover.begin"]


async def test_a_claim_refused_by_closed_admission_is_not_contention(store: WorkStore) -> None:
    """While a family's admission is closed (begin, or a rollback draining), its ready
    items are no candidates: a claim finds nothing (the scheduler then idles) instead of
    reporting them contended (the scheduler claims again at once: a replica spun on the
    database at zero virtual time in the simulation, seed 6 with the cutover operator)."""
    await legacy.install(store)
    await enqueue(store, 2)
    await store.cutover_begin(params(), T0)
    for probe in (True, False):  # the scheduler's idle poll, and its busy claim
        result = await store.work_claim(ClaimParams(
            family="noop", owner="A", limit=10, lease_ttl_us=TTL, window=40,
            include_expired=True, probe_first=probe), T0 + SEC)
        assert (result.claimed, result.contended) == ([], 0)
    await store.cutover_commit(params(), T0 + SEC, PROBE)
    claimed = (await claim(store, now=T0 + SEC)).claimed
    assert len(claimed) == 2
    await store.cutover_rollback_begin(params(), T0 + 2 * SEC)
    await enqueue(store, 1, now=T0 + 2 * SEC)
    result = await store.work_claim(ClaimParams(
        family="noop", owner="B", limit=10, lease_ttl_us=TTL, window=40,
        include_expired=True, probe_first=False), T0 + 3 * SEC)
    assert (result.claimed, result.contended) == ([], 0)


async def test_commit_needs_a_legacy_probe_and_the_bound(store: WorkStore) -> None:
    await legacy.install(store)
    await store.cutover_begin(params(), T0)
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_commit(params(), T0, None)
    assert _codes(exc) == ["legacy_unreported"]
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_commit(params(bound_us=10 * SEC), T0 + 9 * SEC, PROBE)
    assert _codes(exc) == ["admission_recently_closed"]
    gen = await store.owner_generation_get("noop")
    assert gen is not None and gen.phase is Phase.CUTOVER_DRAINING  # nothing committed
    await store.cutover_commit(params(bound_us=10 * SEC), T0 + 10 * SEC, PROBE)


async def test_commit_waits_for_legacy_drain_processes_and_coverage(store: WorkStore) -> None:
    await legacy.install(store)
    (a, b) = await legacy.add_events(store, "noop", ["{}", "{}"], T0)
    held = await legacy.claim_one(store, "noop", "legacy-1", 60 * SEC, T0)
    assert held is not None
    await store.claimant_heartbeat("legacy-1", "legacy", "noop", 0, "running", T0)
    await store.cutover_begin(params(), T0)
    assert await legacy.claim_one(store, "noop", "legacy-1", 60 * SEC, T0) is None
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_commit(params(), T0, PROBE)
    assert _codes(exc) == ["legacy_processing", "legacy_processes", "coverage_gap"]
    assert await legacy.finish(store, held, "legacy-1", "succeeded", T0)
    await store.claimant_heartbeat("legacy-1", "legacy", "noop", 0, "stopped", T0)
    assert await legacy.materialize(store, "noop", "org-1", T0) == 1
    assert await legacy.materialize(store, "noop", "org-1", T0) == 0  # idempotent
    await store.cutover_commit(params(), T0, PROBE)
    (item,) = (await claim(store)).claimed
    assert item.dedupe_key == legacy.work_key(b if held.event_id == a else a)


async def test_rollback_begin_stops_claim_and_reclaim(store: WorkStore) -> None:
    await legacy.install(store)
    await _cut_over(store)
    await enqueue(store, 2)
    (item,) = (await claim(store, limit=1, ttl=TTL)).claimed
    await store.cutover_rollback_begin(params(), T0)
    assert (await claim(store, now=T0)).claimed == []
    # Its lease expires: nobody may reclaim it while the rollback drains.
    late = T0 + TTL + SEC
    assert (await claim(store, "B", now=late)).claimed == []
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_rollback_commit(params(), late)
    assert _codes(exc) == ["expired_leases"]
    assert (await states(store)) == {"processing": 1, "pending": 1}  # the move rolled back
    # Abandoning the rollback (commit) reopens admission: the row is reclaimed.
    await store.cutover_commit(params(), late, PROBE)
    (again,) = (await claim(store, "B", now=late, limit=1)).claimed
    assert again.work_id == item.work_id and again.ownership_epoch == item.ownership_epoch + 1


async def test_rollback_fence_proves_zero_and_binds_the_fenced_set(store: WorkStore) -> None:
    await legacy.install(store)
    await _cut_over(store)
    ids = await enqueue(store, 3)
    (item,) = (await claim(store, limit=1)).claimed
    await store.replica_heartbeat(ReplicaInfo(
        replica_id="r-1", hostname="h", pid=1, version="v", state="running",
        families=json.dumps(["noop", "other"]), started_at_us=T0, heartbeat_at_us=T0))
    await store.cutover_rollback_begin(params(), T0)
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_rollback_commit(params(), T0)
    assert _codes(exc) == ["processing", "replicas_live"]
    await finalize(store, item, Released())  # the owner may still finish under its fence
    await store.replica_heartbeat(ReplicaInfo(
        replica_id="r-1", hostname="h", pid=1, version="v", state="stopped",
        families=json.dumps(["noop"]), started_at_us=T0, heartbeat_at_us=T0))
    done = await store.cutover_rollback_commit(params(), T0)
    assert done.moved == 3 and done.receipt is not None
    assert done.receipt.kind == "rollback" and done.receipt.owner == "legacy"
    assert done.receipt.fenced_count == 3 and done.receipt.fence_id is not None
    assert done.generation.phase is Phase.LEGACY_ACTIVE and done.generation.generation == 2
    fenced = [await store.work_get(i) for i in ids]
    assert {w.rollback_execution_fence_id for w in fenced if w} == {done.receipt.fence_id}
    assert (await states(store)) == {"awaiting_legacy_outcome": 3}
    assert (await claim(store)).claimed == []
    # Re-cutover is blocked while any fenced item awaits its legacy outcome.
    await store.cutover_begin(params(), T0)
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_commit(params(), T0, PROBE)
    assert _codes(exc) == ["awaiting_legacy_outcome"]


async def test_a_started_attempt_or_dispatch_history_blocks_the_fence(
    store: WorkStore,
) -> None:
    from storage.effect_values import AttemptDraft
    from tests.support.commands import accept_pinned, dispatch_pins, draft

    await legacy.install(store)
    await store.cutover_begin(params("external_effect"), T0)
    await store.cutover_commit(params("external_effect"), T0, PROBE)
    accepted = await accept_pinned(store, draft(), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect")).claimed
    assert item.fence is not None
    await store.effect_checkpoint(item.fence, AttemptDraft(
        command_id=accepted.command_id, method="PATCH", target_path="/x", safe_headers="{}",
        body_sha256="sha256:" + "0" * 64, idempotency_key="k", pre_dispatch_evidence="{}",
        pins=dispatch_pins()), lambda: T0)
    await finalize(store, item, Released())
    await store.cutover_rollback_begin(params("external_effect"), T0)
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_rollback_commit(params("external_effect"), T0)
    assert _codes(exc) == ["started_attempts", "dispatch_history"]
    assert (await states(store, "external_effect")) == {"retry": 1}


async def test_illegal_steps_are_refused_with_a_code(store: WorkStore) -> None:
    with pytest.raises(NotUnderCutover) as not_started:
        await store.cutover_rollback_begin(params(), T0)
    assert not_started.value.code == "cutover_not_started"
    with pytest.raises(NotUnderCutover):
        await store.cutover_commit(params(), T0, PROBE)
    await store.cutover_begin(params(), T0)
    with pytest.raises(IllegalStep) as illegal:
        await store.cutover_rollback_commit(params(), T0)
    assert illegal.value.code == "cutover_illegal_step"
    gen = await store.owner_generation_get("noop")
    assert gen is not None and gen.phase is Phase.CUTOVER_DRAINING


async def test_generation_row_is_one_per_family(store: WorkStore) -> None:
    await store.cutover_begin(params("noop"), T0)
    await store.cutover_begin(params("noop"), T0 + SEC)  # idempotent while draining
    gen = await store.owner_generation_get("noop")
    assert gen is not None and gen.admission_closed_at_us == T0  # the first close counts

    async def count(tx: SqlTx) -> int:
        rows = await tx.fetchall("SELECT COUNT(*) FROM owner_generations")
        return int(rows[0][0])

    assert await store.db.transact(count, name="t", write=False) == 1


async def test_an_adapters_own_processes_and_open_claims_block_commit(
    store: WorkStore,
) -> None:
    """The port's optional answers: live processes and open claim transactions the
    legacy owner's own tables know (beyond claimant_processes heartbeats)."""
    await legacy.install(store)
    (event,) = await legacy.add_events(store, "noop", ["{}"], T0)
    claimant = attrs.evolve(
        PROBE,
        processes_sql="SELECT DISTINCT claimed_by FROM legacy_events"
                      " WHERE family = :family AND state = 'processing'",
        open_claims_sql="SELECT event_id FROM legacy_events WHERE family = :family"
                        " AND state = 'processing' AND lease_until_us IS NULL")
    await claimant.verify(store.db)
    # A legacy worker that claimed without a lease (an open claim, as its owner reports
    # it), before admission closed.
    ev = await legacy.claim_one(store, "noop", "old-worker-7", SEC, T0)
    assert ev is not None
    await store.cutover_begin(params(), T0)
    await legacy.materialize(store, "noop", "org-1", T0)

    async def unleased(tx: SqlTx) -> None:
        await tx.execute("UPDATE legacy_events SET lease_until_us = NULL WHERE event_id = ?",
                         (event,))

    await store.db.transact(unleased, name="t.unleased")
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_commit(params(), T0, claimant)
    assert _codes(exc) == ["legacy_processing", "legacy_processes", "legacy_open_claims"]
    sentences = " ".join(b.sentence for b in exc.value.blockers)
    assert "old-worker-7" in sentences and event in sentences
    assert await legacy.finish(store, ev, "old-worker-7", "succeeded", T0)
    done = await store.cutover_commit(params(), T0, claimant)
    assert done.generation.phase is Phase.INTEGRATIOND_ACTIVE


async def test_a_status_snapshot_writes_nothing_to_the_legacy_owners_tables(
    store: WorkStore,
) -> None:
    """The adapter's lock statement is for the steps; a status read runs it in a
    transaction that is rolled back, so looking never changes the legacy rows."""
    await legacy.install(store)
    await legacy.add_events(store, "noop", ["{}", "{}"], T0)

    async def versions(tx: SqlTx) -> list[int]:
        rows = await tx.fetchall("SELECT probe_version FROM legacy_events ORDER BY event_id")
        return [int(r[0]) for r in rows]

    before = await store.db.transact(versions, name="t.v", write=False)
    gen, snap = await store.cutover_snapshot("noop", T0, PROBE)
    assert gen is None and snap.legacy_uncovered == 2  # it did count
    assert await store.db.transact(versions, name="t.v", write=False) == before
