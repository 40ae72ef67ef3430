"""Conformance: legacy outcome receipts, the projector and re-cutover (seed 11.1)."""

from __future__ import annotations

import pytest

from daemon.core.outcomes import Succeeded
from daemon.core.states import WorkState
from sandbox.legacy import store as legacy
from storage.cutover.legacy import LegacyOutcomeReceipt
from storage.cutover.values import CutoverBlocked
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.cutover import legacy_states, params, states
from tests.support.legacy import sandbox_claimant
from tests.support.work import SEC, T0, claim, finalize

PROBE = sandbox_claimant()


async def _rolled_back(store: WorkStore, events: int = 3) -> tuple[list[str], str]:
    """Cut over with ``events`` legacy events materialized, execute one under
    integrationd, roll back: (event ids, fence id)."""
    await legacy.install(store)
    ids = await legacy.add_events(store, "noop", ["{}"] * events, T0)
    await store.cutover_begin(params(), T0)
    assert await legacy.materialize(store, "noop", "org-1", T0) == events
    await store.cutover_commit(params(), T0, PROBE)
    (item,) = (await claim(store, limit=1)).claimed
    assert (await finalize(store, item, Succeeded())).applied
    await store.cutover_rollback_begin(params(), T0)
    done = await store.cutover_rollback_commit(params(), T0)
    assert done.receipt is not None and done.receipt.fence_id is not None
    assert done.moved == events - 1
    return ids, done.receipt.fence_id


async def _drain_legacy(store: WorkStore) -> int:
    n = 0
    while (ev := await legacy.claim_one(store, "noop", "legacy-1", 60 * SEC, T0)) is not None:
        assert await legacy.finish(store, ev, "legacy-1", "succeeded", T0)
        n += 1
    return n


async def test_legacy_runs_only_fenced_work_and_receipts_reconcile(store: WorkStore) -> None:
    _, fence = await _rolled_back(store)
    # The item integrationd already executed is never run again by the legacy owner.
    assert await _drain_legacy(store) == 2
    assert await legacy_states(store) == {"succeeded": 2, "pending": 1}
    # Receipts were written with the terminal transitions; nothing projected yet.
    await store.cutover_begin(params(), T0)
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_commit(params(), T0, PROBE)
    assert [b.code for b in exc.value.blockers] == ["awaiting_legacy_outcome",
                                                    "receipts_unprojected"]
    report = await store.legacy_project(T0)
    assert (report.reconciled, report.duplicate, report.conflict) == (2, 0, 0)
    assert await states(store) == {"succeeded": 1, "reconciled_legacy_terminal": 2}
    (progress,) = await store.legacy_fence_progress("noop")
    assert progress.fence_id == fence and progress.confirmed and progress.reconciled == 2
    # Re-cutover: every fence confirmed. Nothing is reopened or materialized twice.
    await store.cutover_commit(params(), T0, PROBE)
    assert await legacy.materialize(store, "noop", "org-1", T0) == 0
    assert (await claim(store)).claimed == []
    reconciled = await store.work_list(WorkQuery(state=WorkState.RECONCILED_LEGACY_TERMINAL))
    assert {w.legacy_outcome_receipt_version for w in reconciled} == {1}
    assert all(w.legacy_outcome_receipt_digest for w in reconciled)
    # A new legacy event is materialized as one executable WorkItem.
    await legacy.add_events(store, "noop", ["{}"], T0)
    assert await legacy.materialize(store, "noop", "org-1", T0) == 1
    assert len((await claim(store)).claimed) == 1


async def test_duplicate_receipt_is_idempotent(store: WorkStore) -> None:
    _, fence = await _rolled_back(store, events=2)
    (fenced,) = await store.work_list(WorkQuery(state=WorkState.AWAITING_LEGACY_OUTCOME))
    receipt = LegacyOutcomeReceipt(fenced.work_id, fence, 1, "sha256:aa", "succeeded")
    assert await store.legacy_receipt_record(receipt, T0)
    assert not await store.legacy_receipt_record(receipt, T0)  # the same fact again
    assert (await store.legacy_project(T0)).reconciled == 1
    assert (await store.legacy_project(T0)).projected == 0
    after = await store.work_get(fenced.work_id)
    assert after is not None and after.state is WorkState.RECONCILED_LEGACY_TERMINAL
    assert after.legacy_outcome_receipt_digest == "sha256:aa"


async def test_projection_converges_after_a_crash_before_it(
    database: FreshDatabase, store: WorkStore,
) -> None:
    await _rolled_back(store, events=2)
    assert await _drain_legacy(store) == 1  # receipt committed with the legacy terminal
    await store.db.aclose()  # the process dies before any projection
    database.opened.remove(store)
    again = await database.open_store()
    assert await states(again) == {"succeeded": 1, "awaiting_legacy_outcome": 1}
    assert (await again.legacy_project(T0)).reconciled == 1
    assert await states(again) == {"succeeded": 1, "reconciled_legacy_terminal": 1}


async def test_conflicting_receipts_quarantine_and_block_re_cutover(store: WorkStore) -> None:
    _, fence = await _rolled_back(store, events=3)
    a, b = await store.work_list(WorkQuery(state=WorkState.AWAITING_LEGACY_OUTCOME))
    # Two different outcomes for one item before projection: unknown.
    await store.legacy_receipt_record(LegacyOutcomeReceipt(a.work_id, fence, 1, "sha256:1",
                                                           "succeeded"), T0)
    await store.legacy_receipt_record(LegacyOutcomeReceipt(a.work_id, fence, 1, "sha256:2",
                                                           "dead"), T0)
    # A receipt naming another fence: ambiguous as well.
    await store.legacy_receipt_record(LegacyOutcomeReceipt(b.work_id, "not-the-fence", 1,
                                                           "sha256:3", "succeeded"), T0)
    report = await store.legacy_project(T0)
    assert report.conflict == 3 and report.reconciled == 0
    assert await states(store) == {"succeeded": 1, "legacy_outcome_unknown": 2}
    assert (await claim(store)).claimed == []  # unknown is not executable
    await store.cutover_begin(params(), T0)
    with pytest.raises(CutoverBlocked) as exc:
        await store.cutover_commit(params(), T0, PROBE)
    assert [x.code for x in exc.value.blockers] == ["legacy_outcome_unknown",
                                                    "receipts_conflicting"]


async def test_a_later_conflicting_receipt_never_reopens_a_reconciled_row(
    store: WorkStore,
) -> None:
    _, fence = await _rolled_back(store, events=2)
    (item,) = await store.work_list(WorkQuery(state=WorkState.AWAITING_LEGACY_OUTCOME))
    await store.legacy_receipt_record(LegacyOutcomeReceipt(item.work_id, fence, 1, "sha256:1",
                                                           "succeeded"), T0)
    await store.legacy_project(T0)
    await store.legacy_receipt_record(LegacyOutcomeReceipt(item.work_id, fence, 2, "sha256:2",
                                                           "dead"), T0)
    assert (await store.legacy_project(T0)).conflict == 1
    row = await store.work_get(item.work_id)
    assert row is not None and row.state is WorkState.RECONCILED_LEGACY_TERMINAL
    assert row.legacy_outcome_receipt_digest == "sha256:1"
    blockers = await store.cutover_fence_blockers("noop")
    assert blockers.conflicting_receipts == 2  # both receipts of the item now conflict


async def test_a_missing_outcome_becomes_unknown_when_the_fence_closes(
    store: WorkStore,
) -> None:
    _, fence = await _rolled_back(store, events=3)
    first = await legacy.claim_one(store, "noop", "legacy-1", 60 * SEC, T0)
    assert first is not None
    assert await legacy.finish(store, first, "legacy-1", "succeeded", T0)
    assert await store.legacy_fence_close(fence, T0) == 1  # one fenced item has no receipt
    assert await states(store) == {"succeeded": 1, "reconciled_legacy_terminal": 1,
                                   "legacy_outcome_unknown": 1}
    (progress,) = await store.legacy_fence_progress("noop")
    assert not progress.confirmed and progress.unknown == 1
