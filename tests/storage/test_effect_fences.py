"""Conformance: operator dispositions and cancels are fenced, and attempts left with no
outcome count as unresolved (issue 8 items 5, 6, 7; issue 13 item 7), on every backend."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.cancel import CancelRule
from daemon.core.outcomes import CancelAcknowledged, DeadLetter, RetryLater
from daemon.core.states import WorkState
from daemon.core.work import Fence, WorkItem
from storage.bounded import BoundedCount
from storage.effect_values import Disposition, EffectAttempt, Settlement
from storage.effects import dispose
from storage.port import CancelParams, SqlTx, WorkConflict, WorkQuery
from storage.work_admin import CancelRefused, CancelRequested
from storage.work_store import WorkStore
from tests.storage.test_effect_journal import record, settle_fenced
from tests.support.commands import accept_pinned, attempt, draft
from tests.support.work import SEC, T0, claim, enqueue, finalize

WINDOW = 30 * SEC
RULES = {"external_effect": CancelRule.BEFORE_DISPATCH, "runtime_receipt": CancelRule.NEVER,
         "noop": CancelRule.ANYTIME}


def who(work_id: str) -> CancelParams:
    return CancelParams(work_id=work_id, actor="otto", role="operator", reason="stop it")


async def _claimed(store: WorkStore, *, ttl: int = 30 * SEC, now: int = T0,
                   max_attempts: int = 8) -> tuple[str, WorkItem]:
    accepted = await accept_pinned(store, attrs.evolve(draft(), max_attempts=max_attempts), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=ttl, now=now)).claimed
    assert item.fence is not None
    return accepted.command_id, item


async def _dispose(store: WorkStore, attempt_id: str, disposition: Disposition,
                   now: int) -> EffectAttempt:
    return await store.effect_operator_disposition(
        attempt_id=attempt_id, disposition=disposition, note="provider history", actor="otto",
        role="operator", in_flight_window_us=WINDOW, now_us=now)


# ----------------------------------------------------------------- item 5


async def test_disposition_is_refused_while_the_work_item_is_processing(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed(store, ttl=600 * SEC)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    # Far past the in-flight window, but the claimant still holds the item.
    with pytest.raises(WorkConflict, match="is processing"):
        await _dispose(store, attempt_id, Disposition.OPERATOR_ABSENT, T0 + 300 * SEC)
    (row,) = await store.effect_attempts(command_id)
    assert row.disposition is None
    assert await store.audit_list(target_id=attempt_id) == []


async def test_disposition_is_refused_within_the_in_flight_window(store: WorkStore) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    await record(store, item.fence, attempt_id, T0 + 5 * SEC, outcome="OUTCOME_UNKNOWN",
                 status=None, failure_class="transport")
    await finalize(store, item, RetryLater("outcome_unknown", "reconciling"), now=T0 + 5 * SEC)
    # The window runs from the later of the dispatch and the give-up.
    with pytest.raises(WorkConflict, match="in-flight window"):
        await _dispose(store, attempt_id, Disposition.OPERATOR_ABSENT, T0 + 30 * SEC)
    done = await _dispose(store, attempt_id, Disposition.OPERATOR_ABSENT, T0 + 36 * SEC)
    assert done.disposition == "operator_absent"


async def test_the_journal_never_holds_accepted_with_operator_absent(store: WorkStore) -> None:
    # A claimant that still records ACCEPTED after an operator's "absent" (a
    # stale view of the item) fails: the finalization carrying it is refused.
    command_id, item = await _claimed(store, ttl=600 * SEC)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    async def operator(tx: SqlTx) -> None:
        await dispose(tx, [attempt_id], Disposition.OPERATOR_ABSENT, "n", "otto", T0)

    await store.db.transact(operator, name="test.dispose")
    with pytest.raises(WorkConflict, match="outcome or a disposition"):
        await record(store, item.fence, attempt_id, T0, outcome="ACCEPTED", status=200)
    (row,) = await store.effect_attempts(command_id)
    assert (row.outcome, row.disposition) == (None, "operator_absent")
    # And the operator path itself, judged in its UPDATE, refuses a processing item.
    second_id, second = await _second_processing(store)
    second_attempt = await store.effect_checkpoint(second, attempt(second_id, "lead-2"), lambda: T0)

    async def racing(tx: SqlTx) -> None:
        await dispose(tx, [second_attempt], Disposition.OPERATOR_ABSENT, "n", "otto", T0,
                      unless_processing=True)

    with pytest.raises(WorkConflict, match="not awaiting"):
        await store.db.transact(racing, name="test.dispose")


async def _second_processing(store: WorkStore) -> tuple[str, Fence]:
    accepted = await accept_pinned(store, draft("int-2", lead="lead-2"), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=600 * SEC)).claimed
    assert item.fence is not None
    return accepted.command_id, item.fence


async def test_disposition_after_an_accepted_outcome_is_refused(store: WorkStore) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    await record(store, item.fence, attempt_id, T0, outcome="ACCEPTED", status=200)
    await finalize(store, item, DeadLetter("x", "y"))
    with pytest.raises(WorkConflict, match="not awaiting"):
        await _dispose(store, attempt_id, Disposition.OPERATOR_ABSENT, T0 + 100 * SEC)


# ----------------------------------------------------------------- item 6


async def test_attempts_left_without_outcome_are_awaiting_a_disposition(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed(store, ttl=5 * SEC)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    # In flight while its claim is live: not (yet) in the repair queue.
    assert await store.effect_unknown_list() == []
    assert await store.effect_unknown_backlog() == 0
    # The replica is killed mid-dispatch; the lease runs out and the item is reclaimed.
    (again,) = (await claim(store, family="external_effect", now=T0 + 10 * SEC)).claimed
    assert again.work_id == item.work_id and again.ownership_epoch == 2
    assert [a.attempt_id for a in await store.effect_unknown_list()] == [attempt_id]
    assert await store.effect_unknown_backlog() == 1
    assert await store.effect_unresolved_counts() == (BoundedCount(0), BoundedCount(1))


async def test_unresolved_counts_stop_at_their_cap_and_say_more(store: WorkStore) -> None:
    # issue 23: the count read every such attempt (12.7 s at 20M terminal rows); it now
    # stops after cap + 1 index entries and says "more than cap".
    command_id, item = await _claimed(store, ttl=5 * SEC)
    assert item.fence is not None
    await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    other = await accept_pinned(store, draft("int-2", lead="lead-2"), T0)
    assert other.command_id is not None
    (second,) = (await claim(store, family="external_effect", now=T0 + SEC, ttl=5 * SEC,
                             limit=1)).claimed
    assert second.fence is not None and second.subject_id == other.command_id
    await store.effect_checkpoint(second.fence, attempt(other.command_id, "lead-2"),
                                  lambda: T0 + SEC)
    await claim(store, family="external_effect", now=T0 + 20 * SEC)  # both claims ended
    assert await store.effect_unresolved_counts() == (BoundedCount(0), BoundedCount(2))
    unknown, left = await store.effect_unresolved_counts(cap=1)
    assert (unknown, left) == (BoundedCount(0), BoundedCount(1, more=True))
    assert (unknown.text(), left.text()) == ("0", "more than 1")
    assert await store.effect_unresolved_counts(cap=2) == (BoundedCount(0), BoundedCount(2))


async def test_an_expire_dead_leaves_its_attempt_counted_for_the_alert(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed(store, ttl=5 * SEC, max_attempts=1)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    # Past the lease with no attempts left: the reclaim makes it dead.
    await claim(store, family="external_effect", now=T0 + 10 * SEC)
    (dead,) = await store.work_list(WorkQuery(family="external_effect"))
    assert dead.state is WorkState.DEAD
    command = await store.command_get(command_id)
    assert command is not None and command.settlement is Settlement.OPEN
    assert await store.receipt_get(command_id) is None
    # The gauge behind IntegrationdOutcomeUnknownBacklog counts it; the console lists it.
    assert await store.effect_unknown_backlog() == 1
    assert [a.attempt_id for a in await store.effect_unknown_list()] == [attempt_id]


async def test_unknown_and_left_attempts_are_listed_together_oldest_first(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed(store, ttl=5 * SEC)
    assert item.fence is not None
    left = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    other = await accept_pinned(store, draft("int-2", lead="lead-2"), T0)
    assert other.command_id is not None
    (second,) = (await claim(store, family="external_effect", now=T0 + SEC, ttl=60 * SEC,
                             limit=1)).claimed
    assert second.fence is not None and second.subject_id == other.command_id
    unknown = await store.effect_checkpoint(second.fence, attempt(other.command_id, "lead-2"),
                                            lambda: T0 + 2 * SEC)
    await record(store, second.fence, unknown, T0 + 2 * SEC, outcome="OUTCOME_UNKNOWN",
                 status=None, failure_class="transport")
    await finalize(store, second, DeadLetter("outcome_unknown", "x"), now=T0 + 2 * SEC)
    await claim(store, family="external_effect", now=T0 + 10 * SEC)  # reclaims the first
    assert [a.attempt_id for a in await store.effect_unknown_list()] == [left, unknown]
    assert await store.effect_unresolved_counts() == (BoundedCount(1), BoundedCount(1))


# ----------------------------------------------------------------- item 7


async def test_cancel_of_an_effect_after_its_dispatch_checkpoint_is_refused(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    with pytest.raises(CancelRefused, match="outcome is not") as refused:
        await store.work_cancel_audited(who(item.work_id), T0 + 1, RULES)
    assert refused.value.code == "after_dispatch"
    got = await store.work_get(item.work_id)
    assert got is not None and (got.state, got.cancel_requested) == (WorkState.PROCESSING,
                                                                     False)
    assert await store.audit_list(target_id=item.work_id) == []
    # Even a caller that passes no rules cannot cancel mid-dispatch (the journal's rule).
    with pytest.raises(CancelRefused):
        await store.work_cancel(item.work_id, T0 + 1)


async def test_the_dispatch_checkpoint_refuses_after_a_cancel_request(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    result = await store.work_cancel_audited(who(item.work_id), T0, RULES)
    assert result.disposition == "requested"
    with pytest.raises(CancelRequested):
        await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0 + 1)
    assert await store.effect_attempts(command_id) == []
    ack = await finalize(store, item, CancelAcknowledged(), now=T0 + 1)
    assert ack.applied and ack.state is WorkState.CANCELLED


async def test_cancel_of_an_effect_awaiting_reconciliation_is_refused(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    await record(store, item.fence, attempt_id, T0, outcome="OUTCOME_UNKNOWN", status=None,
                 failure_class="transport")
    await finalize(store, item, RetryLater("outcome_unknown", "reconciling"))
    with pytest.raises(CancelRefused, match="outcome is not"):
        await store.work_cancel_audited(who(item.work_id), T0 + 1, RULES)
    got = await store.work_get(item.work_id)
    assert got is not None and got.state is WorkState.RETRY


async def test_an_effect_before_dispatch_can_be_cancelled(store: WorkStore) -> None:
    accepted = await store.command_accept(draft(), T0)
    (item,) = await store.work_list(WorkQuery(family="external_effect"))
    result = await store.work_cancel_audited(who(item.work_id), T0, RULES)
    assert (result.disposition, result.state) == ("cancelled", WorkState.CANCELLED)
    command = await store.command_get(str(accepted.command_id))
    assert command is not None and command.settlement is Settlement.OPEN


async def test_a_receipt_item_cannot_be_cancelled(store: WorkStore) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    receipt_work = await settle_fenced(store, item.fence, command_id, T0,
                                       settlement=Settlement.SUCCEEDED, result_format=1,
                                       remote_id="7")
    with pytest.raises(CancelRefused, match="Runtime must receive") as refused:
        await store.work_cancel_audited(who(receipt_work), T0 + 1, RULES)
    assert refused.value.code == "family_not_cancellable"
    got = await store.work_get(receipt_work)
    assert got is not None and got.state is WorkState.PENDING


async def test_cancel_of_a_terminal_item_is_refused(store: WorkStore) -> None:
    (wid,) = await enqueue(store)
    await store.work_cancel_audited(who(wid), T0, RULES)
    with pytest.raises(CancelRefused, match="is cancelled") as refused:
        await store.work_cancel_audited(who(wid), T0 + 1, RULES)
    assert refused.value.code == "terminal"
    cancels = [e for e in await store.audit_list(target_id=wid) if e.action == "work.cancel"]
    assert len(cancels) == 1


# ----------------------------------------------------------------- issue 20 item 7


@pytest.mark.parametrize(("outcome", "evidence", "disposable"), [
    # A replay-safe retry that may have been applied: once its replay proof lapsed
    # (the provider's retention of the key), reconciliation must be able to resolve it.
    ("REPLAY_SAFE_RETRY", "maybe_applied", True),
    # Negative rows: proven outcomes are never disposed of.
    ("REPLAY_SAFE_RETRY", "not_applied", False),  # a declared not-applied status (429)
    ("RETRYABLE_PRE_DISPATCH", "not_sent", False),
    ("REJECTED", "not_applied", False),
])
async def test_reconciliation_resolves_a_lapsed_replay_safe_retry_only(
        store: WorkStore, outcome: str, evidence: str, disposable: bool) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    await record(store, item.fence, attempt_id, T0, outcome=outcome, status=None,
                 effect_evidence=evidence)
    if disposable:
        await store.effect_dispose(item.fence, [attempt_id], Disposition.PROVEN_ABSENT,
                                   "read back, key retention passed", lambda: T0 + SEC)
    else:
        with pytest.raises(WorkConflict, match="not awaiting"):
            await store.effect_dispose(item.fence, [attempt_id], Disposition.PROVEN_ABSENT,
                                       "read back", lambda: T0 + SEC)
    (row,) = await store.effect_attempts(command_id)
    assert row.disposition == (Disposition.PROVEN_ABSENT.value if disposable else None)
