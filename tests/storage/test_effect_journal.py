"""Conformance: the effect journal, settlement and receipts, fenced, on every backend."""

from __future__ import annotations

import pytest

from daemon.core.outcomes import RetryLater
from daemon.core.work import Fence, WorkItem
from storage.effect_values import BindingNow, Disposition, ReceiptState, Settlement
from storage.effects import (
    EffectContextRow,
    mark_receipt,
    read_effect_context,
    record_outcome,
    settle,
)
from storage.port import LostLease, SqlTx, WorkConflict, WorkQuery
from storage.work_store import WorkStore
from tests.support.commands import (
    TARGETS_SCOPE_DIGEST,
    accept_pinned,
    attempt,
    draft,
)
from tests.support.work import SEC, T0, claim, finalize


async def record(store: WorkStore, fence: Fence, attempt_id: str, now: int, *, outcome: str,
                 status: int | None, failure_class: str = "",
                 evidence: dict[str, str] | None = None,
                 effect_evidence: str = "maybe_applied") -> None:
    """The attempt's outcome, written under the fence (as the finalize side write does)."""
    await store.work_fenced(fence, lambda: now, lambda tx: record_outcome(
        tx, attempt_id, outcome=outcome, evidence=effect_evidence, response_status=status,
        provider_evidence=evidence or {}, failure_class=failure_class, gave_up_at_us=now,
        now_us=now),
        name="test.record")


async def settle_fenced(store: WorkStore, fence: Fence, command_id: str, now: int, *,
                        settlement: Settlement, result_format: int, remote_id: str = "",
                        canonical: str = "", digest: str = "") -> str:
    return await store.work_fenced(fence, lambda: now, lambda tx: settle(
        tx, command_id=command_id, settlement=settlement, result_format_version=result_format,
        remote_id=remote_id, canonical_result=canonical, result_digest=digest,
        receipt_max_attempts=5, now_us=now), name="test.settle")


async def _claimed_command(store: WorkStore, ttl: int = 30 * SEC) -> tuple[str, WorkItem]:
    result = await accept_pinned(store, draft(), T0)
    assert result.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=ttl)).claimed
    return result.command_id, item


async def test_checkpoint_needs_the_live_fence_and_is_one_per_claim(store: WorkStore) -> None:
    command_id, item = await _claimed_command(store, ttl=5 * SEC)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    with pytest.raises(WorkConflict, match="unresolved attempt"):
        await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    (row,) = await store.effect_attempts(command_id)
    assert (row.attempt_id, row.ownership_epoch, row.outcome, row.unresolved) == (
        attempt_id, 1, None, True)
    # After the lease is gone, the stale claimant can neither checkpoint nor record.
    later = T0 + 6 * SEC
    with pytest.raises(LostLease):
        await store.effect_checkpoint(item.fence, attempt(command_id), lambda: later)
    with pytest.raises(LostLease):
        await record(store, item.fence, attempt_id, later, outcome="ACCEPTED", status=200)
    with pytest.raises(LostLease):
        await settle_fenced(store, item.fence, command_id, later,
                            settlement=Settlement.SUCCEEDED, result_format=1, remote_id="7")
    assert (await store.command_get(command_id)).settlement is Settlement.OPEN  # type: ignore[union-attr]


async def test_one_outcome_per_attempt_then_settlement_queues_the_receipt(
    store: WorkStore,
) -> None:
    command_id, item = await _claimed_command(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    await record(store, item.fence, attempt_id, T0, outcome="ACCEPTED", status=200,
                 evidence={"id": "7"})
    with pytest.raises(WorkConflict, match="already has an outcome"):
        await record(store, item.fence, attempt_id, T0, outcome="REJECTED", status=400,
                     failure_class="x")
    receipt_work = await settle_fenced(store, item.fence, command_id, T0,
                                       settlement=Settlement.SUCCEEDED, result_format=1,
                                       remote_id="7")
    with pytest.raises(WorkConflict, match="already settled"):
        await settle_fenced(store, item.fence, command_id, T0, settlement=Settlement.NO_EFFECT,
                            result_format=2, canonical="{}", digest="x")
    # No further dispatch once settled.
    with pytest.raises(WorkConflict, match="no further dispatch"):
        await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    receipt = await store.receipt_get(command_id)
    assert receipt is not None
    assert (receipt.result_format_version, receipt.remote_id, receipt.state) == (
        1, "7", ReceiptState.PENDING)
    (sender,) = await store.work_list(WorkQuery(family="runtime_receipt"))
    assert sender.work_id == receipt_work and sender.subject_id == command_id
    (claimed,) = (await claim(store, family="runtime_receipt")).claimed
    assert claimed.fence is not None
    await store.work_fenced(claimed.fence, lambda: T0, lambda tx: mark_receipt(
        tx, command_id, confirmed=True, error=None, now_us=T0), name="test.mark")
    confirmed = await store.receipt_get(command_id)
    assert confirmed is not None and confirmed.state is ReceiptState.CONFIRMED


async def test_unknown_outcomes_wait_for_a_disposition(store: WorkStore) -> None:
    command_id, item = await _claimed_command(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    await record(store, item.fence, attempt_id, T0, outcome="OUTCOME_UNKNOWN", status=None,
                 failure_class="transport")
    # The claimant finishes (an operator never disposes under a live claim) and
    # the provider's in-flight window passes.
    await finalize(store, item, RetryLater("outcome_unknown", "reconciling"))
    later = T0 + 60 * SEC
    assert await store.effect_unknown_backlog() == 1
    with pytest.raises(WorkConflict, match="operator_applied or operator_absent"):
        await store.effect_operator_disposition(
            attempt_id=attempt_id, disposition=Disposition.PROVEN_APPLIED, note="n",
            actor="alice", role="operator", in_flight_window_us=30 * SEC, now_us=later)
    done = await store.effect_operator_disposition(
        attempt_id=attempt_id, disposition=Disposition.OPERATOR_APPLIED,
        note="HubSpot audit log shows the change", actor="alice", role="operator",
        in_flight_window_us=30 * SEC, now_us=later)
    assert (done.disposition, done.disposition_by, done.outcome, done.unresolved) == (
        "operator_applied", "alice", "OUTCOME_UNKNOWN", False)
    with pytest.raises(WorkConflict, match="not awaiting"):
        await store.effect_operator_disposition(
            attempt_id=attempt_id, disposition=Disposition.OPERATOR_ABSENT, note="n",
            actor="bob", role="admin", in_flight_window_us=30 * SEC, now_us=later)
    assert await store.effect_unknown_backlog() == 0
    (entry,) = await store.audit_list(target_id=attempt_id)
    assert (entry.action, entry.actor, entry.reason) == (
        "effect.disposition", "alice", "HubSpot audit log shows the change")


async def test_checkpoints_commit_together_and_each_gets_its_own_answer(
    store: WorkStore,
) -> None:
    ids = []
    for i in range(5):
        accepted = await accept_pinned(store, draft(f"int-{i}", lead=f"lead-{i}"), T0)
        assert accepted.command_id is not None
        ids.append(accepted.command_id)
    claimed = (await claim(store, family="external_effect", ttl=5 * SEC)).claimed
    items = {i.subject_id: i for i in claimed}
    fences = [items[c].fence for c in ids]
    assert all(f is not None for f in fences)
    f0, f1, f2, f3, f4 = (f for f in fences if f is not None)
    # ids[1] already has an unresolved attempt; ids[2] is settled; f3 is a stale fence.
    await store.effect_checkpoint(f1, attempt(ids[1], "lead-1"), lambda: T0)
    await settle_fenced(store, f2, ids[2], T0, settlement=Settlement.NO_EFFECT,
                        result_format=2, canonical="{}", digest="sha256:" + "1" * 64)
    stale = Fence(f3.work_id, "not-the-token", f3.ownership_epoch)
    commits = store.db.stats.commits
    answers = await store.effect_checkpoint_many([
        (f0, attempt(ids[0], "lead-0")), (f1, attempt(ids[1], "lead-1")),
        (f2, attempt(ids[2], "lead-2")), (stale, attempt(ids[3], "lead-3")),
        (f4, attempt(ids[4], "lead-4")),
        (f4, attempt(ids[4], "lead-4")),  # the same command twice in one batch
    ], lambda: T0 + 1)
    assert store.db.stats.commits == commits + 1
    assert isinstance(answers[0], str) and isinstance(answers[4], str)
    assert [type(a) for a in answers[1:4]] == [WorkConflict, WorkConflict, LostLease]
    assert "unresolved attempt" in str(answers[1]) and "no further dispatch" in str(answers[2])
    assert isinstance(answers[5], WorkConflict) and "unresolved" in str(answers[5])
    for command_id, expected in ((ids[0], [answers[0]]), (ids[3], []), (ids[4], [answers[4]])):
        assert [a.attempt_id for a in await store.effect_attempts(command_id)] == expected
    (row,) = await store.effect_attempts(ids[4])
    assert (row.work_id, row.ownership_epoch) == (f4.work_id, f4.ownership_epoch)
    # Past the lease, nothing is written and every answer is LostLease.
    late = await store.effect_checkpoint_many([(f0, attempt(ids[0], "lead-0"))],
                                              lambda: T0 + 6 * SEC)
    assert [type(a) for a in late] == [LostLease]


async def test_the_effect_context_is_one_read(store: WorkStore) -> None:
    command_id, item = await _claimed_command(store)
    assert item.fence is not None
    link = await store.link_get(TARGETS_SCOPE_DIGEST, "lead", "lead-1")
    assert link is not None

    async def read(key: str) -> EffectContextRow | None:
        async def body(tx: SqlTx) -> EffectContextRow | None:
            return await read_effect_context(tx, command_id, key)

        return await store.db.transact(body, name="test.context", write=False)

    before = store.db.stats.statements
    found = await read(link.link_key)
    assert store.db.stats.statements == before + 1
    assert found is not None
    command, attempts, got, binding = found
    assert command == await store.command_get(command_id)
    assert (attempts, got, binding) == (0, link, BindingNow(1, True))
    await store.effect_checkpoint(item.fence, attempt(command_id), lambda: T0)
    assert await read("no-such-link") == (command, 1, None, BindingNow(1, True))
    assert await read_effect_context_missing(store) is None


async def read_effect_context_missing(store: WorkStore) -> object:
    async def body(tx: SqlTx) -> object:
        return await read_effect_context(tx, "no-such-command", "k")

    return await store.db.transact(body, name="test.context", write=False)


async def test_many_effect_contexts_are_two_reads(store: WorkStore) -> None:
    ids = []
    for i in range(3):
        accepted = await store.command_accept(draft(f"int-{i}", lead=f"lead-{i}"), T0)
        assert accepted.command_id is not None
        ids.append(accepted.command_id)
    links = [await store.link_adopt("b" * 64, "lead", f"lead-{i}", "contact", str(70 + i),
                                    actor="t", role="admin", reason="seed", now_us=T0)
             for i in range(2)]
    requests = [(ids[0], links[0].link_key), (ids[1], links[1].link_key),
                (ids[2], "ilk2:" + "0" * 64), ("no-such-command", links[0].link_key),
                (ids[0], links[0].link_key)]
    before = store.db.stats.statements
    found = await store.effect_contexts(requests)
    assert store.db.stats.statements == before + 2
    singles = [await store.effect_contexts([r]) for r in requests]
    assert found == [s[0] for s in singles]
    assert [f[2] if f else None for f in found] == [links[0], links[1], None, None, links[0]]
    assert [f[0].command_id if f else None for f in found] == [ids[0], ids[1], ids[2], None,
                                                               ids[0]]
