"""Conformance: a batch of effect and receipt finalizations writes its side rows in a few
statements, not a few per item, with every guard of the row-at-a-time writes kept (a
conflicting item is left out alone), on every backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from daemon.core.outcomes import Succeeded
from daemon.core.work import WorkItem
from storage.effect_values import Command, ReceiptState, Settlement
from storage.effects import mark_receipt, record_outcome, settle
from storage.history import EXECUTION_LEVELS_US
from storage.port import SqlTx, WorkQuery
from storage.work_store import WorkStore
from tests.support.commands import accept_pinned, attempt, draft
from tests.support.work import SEC, T0, claim, finalization

N = 6


async def _dispatched(store: WorkStore, n: int) -> list[tuple[Command, str, WorkItem]]:
    """``n`` commands claimed and checkpointed: (command, attempt id, claimed item)."""
    ids = []
    for i in range(n):
        accepted = await accept_pinned(store, draft(f"int-{i}", lead=f"lead-{i}"), T0)
        assert accepted.command_id is not None
        ids.append(accepted.command_id)
    claimed = {i.subject_id: i for i in
               (await claim(store, family="external_effect", ttl=30 * SEC, limit=n)).claimed}
    out = []
    for command_id in ids:
        item = claimed[command_id]
        assert item.fence is not None
        command = await store.command_get(command_id)
        assert command is not None
        out.append((command, await store.effect_checkpoint(
            item.fence, attempt(command_id, f"lead-{ids.index(command_id)}"), lambda: T0), item))
    return out


def _accepted(command: Command, attempt_id: str, remote_id: str
              ) -> Callable[[SqlTx], Awaitable[None]]:
    """What the effect runner writes with an accepted attempt's finalization (with the
    command it read with its context)."""
    command_id = command.command_id

    async def write(tx: SqlTx) -> None:
        await record_outcome(tx, attempt_id, outcome="ACCEPTED", evidence="applied",
                             response_status=200, provider_evidence={"id": remote_id},
                             failure_class="", gave_up_at_us=T0 + 1, now_us=T0 + 1)
        await settle(tx, command_id=command_id, command=command, settlement=Settlement.SUCCEEDED,
                     result_format_version=1, remote_id=remote_id, canonical_result="",
                     result_digest="", receipt_max_attempts=5, now_us=T0 + 1,
                     modified_at_us=T0)
    return write


async def test_settling_many_effects_costs_statements_per_batch_not_per_item(
    store: WorkStore,
) -> None:
    batch = await _dispatched(store, N)
    before = store.db.stats.statements
    results = await store.work_finalize_if_owner(
        [finalization(item, Succeeded()) for _, _, item in batch], "A", lambda: T0 + 1,
        side_writes={item.work_id: _accepted(c, a, f"r{i}")
                     for i, (c, a, item) in enumerate(batch)})
    assert all(r.applied for r in results)
    # The fence UPDATE, the journal's rows, the effect items' history keys, the rollup's
    # UPDATE and, the first time in a fresh database, one INSERT per level of it
    # (storage.history.EXECUTION_LEVELS_US), and one statement per kind of side row
    # (attempt outcomes, settlements, receipts, receipt WorkItems); row-at-a-time it was
    # four per item.
    most = 8 + len(EXECUTION_LEVELS_US)
    assert store.db.stats.statements - before <= most, store.db.stats.statements - before
    for i, (command, attempt_id, _) in enumerate(batch):
        command_id = command.command_id
        settled = await store.command_get(command_id)
        assert settled is not None and settled.settlement is Settlement.SUCCEEDED
        (row,) = await store.effect_attempts(command_id)
        assert (row.attempt_id, row.outcome, row.response_status, row.finished_at_us) == (
            attempt_id, "ACCEPTED", 200, T0 + 1)
        receipt = await store.receipt_get(command_id)
        assert receipt is not None
        assert (receipt.remote_id, receipt.state) == (f"r{i}", ReceiptState.PENDING)
    senders = await store.work_list(WorkQuery(family="runtime_receipt"))
    assert sorted(s.subject_id for s in senders) == sorted(c.command_id for c, _, _ in batch)
    # And the receipts, confirmed together.
    receipts = (await claim(store, family="runtime_receipt", limit=N, now=T0 + 2)).claimed
    assert len(receipts) == N, len(receipts)
    before = store.db.stats.statements

    def confirmed(command_id: str) -> Callable[[SqlTx], Awaitable[None]]:
        async def write(tx: SqlTx) -> None:
            await mark_receipt(tx, command_id, confirmed=True, error=None, now_us=T0 + 2)
        return write

    results = await store.work_finalize_if_owner(
        [finalization(r, Succeeded()) for r in receipts], "A", lambda: T0 + 2,
        side_writes={r.work_id: confirmed(r.subject_id) for r in receipts})
    assert all(r.applied for r in results)
    # The fence UPDATE, the journal's rows and rollups, one UPDATE for the confirmations
    # (row at a time it was one per item more).
    assert store.db.stats.statements - before <= 9, store.db.stats.statements - before
    for command, _, _ in batch:
        receipt = await store.receipt_get(command.command_id)
        assert receipt is not None and receipt.state is ReceiptState.CONFIRMED
        assert receipt.confirmed_at_us == T0 + 2


async def test_a_conflicting_item_in_a_batch_is_left_out_alone(store: WorkStore) -> None:
    batch = await _dispatched(store, 4)
    (_, _, _), (_, a1, i1), (_, _, i2), (_, _, _) = batch
    c0, c1, c2, c3 = (c.command_id for c, _, _ in batch)
    # Attempt 1 already has an outcome; command 2 is already settled (by another path).
    assert i1.fence is not None and i2.fence is not None
    await store.work_fenced(i1.fence, lambda: T0, lambda tx: record_outcome(
        tx, a1, outcome="REJECTED", evidence="not_applied", response_status=400,
        provider_evidence={}, failure_class="x", gave_up_at_us=T0, now_us=T0),
        name="test.record")
    await store.work_fenced(i2.fence, lambda: T0, lambda tx: tx.execute(
        "UPDATE external_commands SET settlement = 'no_effect' WHERE command_id = ?", (c2,)),
        name="test.settle")
    results = await store.work_finalize_if_owner(
        [finalization(item, Succeeded()) for _, _, item in batch], "A", lambda: T0 + 1,
        side_writes={item.work_id: _accepted(c, a, f"r{i}")
                     for i, (c, a, item) in enumerate(batch)})
    assert [r.applied for r in results] == [True, False, False, True]
    assert "already has an outcome" in (results[1].error or "")
    assert "already settled" in (results[2].error or "")
    for command_id, settled in ((c0, True), (c1, False), (c2, False), (c3, True)):
        receipt = await store.receipt_get(command_id)
        assert (receipt is not None) is settled
    (row,) = await store.effect_attempts(c1)
    assert (row.outcome, row.response_status) == ("REJECTED", 400)
    (row,) = await store.effect_attempts(c2)
    assert row.outcome is None  # its finalization (and its outcome) rolled back
