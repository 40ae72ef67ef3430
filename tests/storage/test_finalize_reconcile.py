"""Conformance: the read-back of a finalization whose COMMIT outcome is unknown
(``WorkClaims._reconcile_finalize``) answers what happened, also once another replica has
claimed the item again.

Finding (seed 78 of the claims branch, 2026-12-06): a retry's finalization committed with
its answer lost, and by the time the read-back ran another replica had claimed the retried
row; the read-back looked for the row under our fence, found none, and answered "not
applied", so the replica logged ``work_lease_lost finalize_refused`` for an item it had
finalized. Our epoch's journal row, written in the finalization's own transaction, says it
committed. The read-back is called directly here: its caller, the COMMIT whose answer was
lost, is tests/storage/test_faults.py's (MariaDB through a proxy that cuts the reply)."""

from __future__ import annotations

from daemon.core.outcomes import Deferred, Outcome, Released, RetryLater, Succeeded
from daemon.core.states import WorkState
from storage.port import FinalizeResult
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, claim, enqueue, finalization


async def _finalized_then_claimed_again(store: WorkStore, outcome: Outcome
                                        ) -> tuple[FinalizeResult, FinalizeResult]:
    """A's finalization with ``outcome`` commits, then B claims the item again. Returns
    what A's finalization answered and what the read-back answers for it."""
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, "A", now=T0)).claimed
    fin = finalization(item, outcome, now=T0)
    (answered,) = await store.work_finalize_if_owner([fin], "A", lambda: T0 + 1)
    again = (await claim(store, "B", now=T0 + 3600 * SEC)).claimed
    assert [i.work_id for i in again] == [item.work_id]  # B holds it now, A's fence is gone
    (read_back,) = await store._reconcile_finalize([fin])
    return answered, read_back


async def test_a_committed_retry_reads_back_applied_after_another_claim(
        store: WorkStore) -> None:
    answered, read_back = await _finalized_then_claimed_again(store, RetryLater("x"))
    assert answered.applied and answered.state is WorkState.RETRY
    assert (read_back.applied, read_back.state) == (True, WorkState.RETRY)


async def test_a_committed_deferral_reads_back_applied_after_another_claim(
        store: WorkStore) -> None:
    answered, read_back = await _finalized_then_claimed_again(
        store, Deferred("quota_slot", run_after_us=T0 + 2))
    assert answered.applied
    assert (read_back.applied, read_back.state) == (True, answered.state)


async def test_a_release_cannot_be_told_once_the_row_moved_on(store: WorkStore) -> None:
    # Not journaled (a released attempt is refunded, not an execution): nothing outlives
    # the fence, so the read-back answers not applied, as before.
    answered, read_back = await _finalized_then_claimed_again(store, Released())
    assert answered.applied
    assert (read_back.applied, read_back.state) == (False, None)


async def test_a_finalization_that_never_committed_reads_back_not_applied(
        store: WorkStore) -> None:
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, "A", now=T0)).claimed
    fin = finalization(item, RetryLater("x"), now=T0)
    # Never committed: the lease ran out and B reclaimed the item (A's epoch journaled
    # lease_lost by B, not with A's outcome).
    assert (await claim(store, "B", now=T0 + 3600 * SEC)).claimed
    (read_back,) = await store._reconcile_finalize([fin])
    assert (read_back.applied, read_back.state) == (False, None)
    # And one that committed under the fence is read back by the fence, as before.
    await enqueue(store, 1, now=T0)
    (other,) = (await claim(store, "A", now=T0 + 3600 * SEC)).claimed
    done = finalization(other, Succeeded(), now=T0)
    assert (await store.work_finalize_if_owner([done], "A", lambda: T0 + 3600 * SEC))[0].applied
    (read_back,) = await store._reconcile_finalize([done])
    assert (read_back.applied, read_back.state) == (True, WorkState.SUCCEEDED)
