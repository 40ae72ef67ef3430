"""Conformance: retention prunes old terminal history and nothing it must keep.

On every backend: terminal items, their executions, resolved effect attempts of settled
commands and confirmed receipts go after the work horizon; dedup facts and the handoff
fence (admission facts, rejection tombstones) stay until the longer facts horizon; live
work, unsettled commands and unknown outcomes are never touched; the lease lets one
pruner at a time delete, and a pruner that lost it deletes nothing.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from daemon.core.outcomes import RetryLater, Succeeded
from daemon.core.retention import DAY_US, Cutoffs, LeaseHeld
from daemon.core.states import WorkState
from daemon.services.metrics import Metrics
from storage.effect_values import Admission
from storage.port import ReplayParams, SqlTx
from storage.retention.prune import (
    BatchParams,
    LeaseGranted,
    LeaseParams,
    RetentionLeaseLost,
)
from storage.retention.rules import RULES
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.commands import SCOPE, draft
from tests.support.ingress import materialization, receipt
from tests.support.retention import INGRESS_DAYS, PAST_FACTS, PAST_WORK, count, ids, prune
from tests.support.work import SEC, T0, claim, enqueue, finalize, spec


async def _finished(store: WorkStore, n: int, *, now: int = T0, **kw: Any) -> list[str]:
    """``n`` items that succeeded at ``now`` (one execution each)."""
    wids = await enqueue(store, n, now=now, **kw)
    done: list[str] = []
    while len(done) < n:
        for item in (await claim(store, now=now, limit=50)).claimed:
            assert (await finalize(store, item, Succeeded(), now=now)).applied
            done.append(item.work_id)
    assert sorted(done) == sorted(wids)
    return wids


async def test_terminal_items_and_executions_go_after_the_work_horizon(
    store: WorkStore,
) -> None:
    old = await _finished(store, 20)
    fresh = await _finished(store, 3, now=PAST_WORK - 10 * DAY_US)
    metrics = Metrics()
    # Within the horizon nothing goes.
    await prune(store, T0 + 29 * DAY_US)
    assert await count(store, "work_items") == 23
    summary = await prune(store, PAST_WORK, metrics=metrics)
    assert await ids(store, "work_items", "work_id") == set(fresh)
    assert await ids(store, "work_executions", "work_id") == set(fresh)
    assert summary["tables"]["work_items"]["pruned"] == 20
    assert summary["tables"]["work_executions"]["pruned"] == 20
    # The lag: how far past its horizon the oldest prunable row was (about a day).
    assert summary["tables"]["work_items"]["lag_s"] == pytest.approx(86_400, abs=2)
    text = metrics.render().decode()
    assert 'integrationd_retention_pruned_rows_total{table="work_items"} 20.0' in text
    assert 'integrationd_retention_pruned_rows_total{table="work_executions"} 20.0' in text
    status = await store.retention_status()
    assert status is not None and status.holder is None  # released
    assert status.last_pass["tables"]["work_items"]["pruned"] == 20
    assert old  # (the old ones are the ones gone)


async def test_live_work_and_its_history_are_never_touched(store: WorkStore) -> None:
    pending = await enqueue(store, 2)
    (retry_id,) = await enqueue(store, 1, subject_id="lead-retry")
    await enqueue(store, 1, subject_id="lead-run")
    # One item retries (an execution row, live item); one is processing.
    claimed = (await claim(store, limit=10)).claimed
    by_id = {i.work_id: i for i in claimed}
    await finalize(store, by_id[retry_id], RetryLater("flaky"))
    for wid in pending:
        await finalize(store, by_id[wid], RetryLater("flaky"))
    before = await count(store, "work_items")
    executions = await count(store, "work_executions")
    await prune(store, PAST_FACTS + 1000 * DAY_US)
    assert await count(store, "work_items") == before == 4
    assert await count(store, "work_executions") == executions == 3
    states = {(await store.work_get(w)).state for w in pending}  # type: ignore[union-attr]
    assert states == {WorkState.RETRY}


async def test_dedup_remembers_its_key_until_the_facts_horizon(store: WorkStore) -> None:
    (wid,) = await _finished(store, 1, dedupe_key="lead-1:update:42")
    (plain,) = await _finished(store, 1, subject_id="lead-2")
    await prune(store, PAST_WORK)
    assert await ids(store, "work_items", "work_id") == {wid}
    # A late duplicate enqueue is still deduplicated, not run a second time.
    (again,) = await store.work_enqueue([spec(dedupe_key="lead-1:update:42")], PAST_WORK)
    assert (again.work_id, again.created) == (wid, False)
    await prune(store, PAST_FACTS)
    assert await count(store, "work_items") == 0
    assert plain


async def test_a_replay_is_kept_while_its_original_exists(store: WorkStore) -> None:
    (original,) = await _finished(store, 1)
    replay = await store.work_replay(ReplayParams(work_id=original, actor="op", role="admin",
                                                  reason="test"), T0 + SEC)
    (item,) = (await claim(store, now=T0 + 2 * SEC)).claimed
    assert item.work_id == replay.work_id
    await finalize(store, item, Succeeded(), now=T0 + 2 * SEC)
    # Suppose the original were kept (by a guard) while its replay aged out: the replay
    # must stay, or the original could be replayed a second time.
    await _set(store, "UPDATE work_items SET updated_at_us = ? WHERE work_id = ?",
               (PAST_WORK, original))
    await prune(store, PAST_WORK)
    assert await ids(store, "work_items", "work_id") == {original, replay.work_id}
    # Once the original is gone (a batch judges before it deletes, so the replay waits
    # for the next sweep), so may the replay be.
    await prune(store, PAST_WORK + 31 * DAY_US)
    assert await ids(store, "work_items", "work_id") == {replay.work_id}
    await prune(store, PAST_WORK + 33 * DAY_US)
    assert await count(store, "work_items") == 0


async def _set(store: WorkStore, sql: str, params: tuple[Any, ...]) -> None:
    async def body(tx: SqlTx) -> None:
        await tx.execute(sql, params)

    await store.db.transact(body, name="test.set")


async def test_the_handoff_fence_outlives_the_work_horizon(store: WorkStore) -> None:
    rejected = draft("int-rejected")
    tomb = await store.command_reject_if_unaccepted(
        scope=SCOPE, runtime_name="crm", handoff_key=rejected.handoff_key,
        payload_digest=rejected.payload_digest,
        runtime_outbox_id=rejected.runtime_outbox_id, now_us=T0)
    assert tomb.admission is Admission.HANDOFF_REJECTED
    accepted = await store.command_accept(draft("int-open"), T0)
    assert accepted.work_id is not None and accepted.command_id is not None
    # The open command's work was cancelled: terminal, but its command is unsettled.
    await store.work_cancel(accepted.work_id, T0)
    await prune(store, PAST_WORK)
    late = await store.command_accept(rejected, PAST_WORK)
    assert (late.admission, late.command_id) == (Admission.HANDOFF_REJECTED, None)
    assert await count(store, "handoff_admissions") == 2
    # Past the facts horizon the tombstone goes; the unsettled command's fact and work stay.
    await prune(store, PAST_FACTS)
    assert await ids(store, "handoff_admissions", "admission") == {"COMMAND_ACCEPTED"}
    assert await ids(store, "work_items", "work_id") == {accepted.work_id}
    again = await store.command_accept(draft("int-open"), PAST_FACTS)
    assert (again.admission, again.command_id) == (Admission.COMMAND_ACCEPTED,
                                                   accepted.command_id)


async def _attempt(store: WorkStore, attempt_id: str, command_id: str, work_id: str,
                   epoch: int, outcome: str | None, disposition: str | None,
                   finished_at_us: int | None) -> None:
    await _set(store,
               "INSERT INTO effect_attempts (attempt_id, command_id, work_id, ownership_epoch,"
               " lease_token, method, target_path, safe_headers, body_sha256,"
               " idempotency_key, pre_dispatch_evidence, dispatch_started_at_us, outcome,"
               " disposition, finished_at_us, row_version) VALUES (?, ?, ?, ?, 'tok',"
               " 'PATCH', '/x', '{}', 'sha', 'idem', '{}', ?, ?, ?, ?, 0)",
               (attempt_id, command_id, work_id, epoch, T0, outcome, disposition,
                finished_at_us))


async def test_effect_attempts_go_only_when_resolved_and_their_command_settled(
    store: WorkStore,
) -> None:
    settled = await store.command_accept(draft("int-settled"), T0)
    unsettled = await store.command_accept(draft("int-unsettled", lead="lead-2"), T0)
    assert settled.command_id and settled.work_id and unsettled.command_id
    assert unsettled.work_id
    for wid in (settled.work_id, unsettled.work_id):
        await store.work_cancel(wid, T0)
    await _attempt(store, "A-ok", settled.command_id, settled.work_id, 1, "ACCEPTED", None, T0)
    await _attempt(store, "A-unknown-disposed", settled.command_id, settled.work_id, 2,
                   "OUTCOME_UNKNOWN", "operator_absent", T0)
    await _attempt(store, "A-unknown", settled.command_id, settled.work_id, 3,
                   "OUTCOME_UNKNOWN", None, T0)
    await _attempt(store, "A-no-outcome", settled.command_id, settled.work_id, 4, None, None,
                   None)
    await _attempt(store, "B-ok", unsettled.command_id, unsettled.work_id, 1, "REJECTED",
                   None, T0)
    await _set(store, "UPDATE external_commands SET settlement = 'succeeded'"
                      " WHERE command_id = ?", (settled.command_id,))
    await _set(store, "INSERT INTO result_receipts (command_id, intent_id,"
                      " result_format_version, remote_id, canonical_result, result_digest,"
                      " state, last_error, created_at_us, confirmed_at_us) VALUES"
                      " (?, 'int-settled', 1, 'r1', '{}', 'sha', 'confirmed', NULL, ?, ?)",
               (settled.command_id, T0, T0))
    await _set(store, "INSERT INTO result_receipts (command_id, intent_id,"
                      " result_format_version, remote_id, canonical_result, result_digest,"
                      " state, last_error, created_at_us, confirmed_at_us) VALUES"
                      " (?, 'int-unsettled', 1, 'r2', '{}', 'sha', 'pending', NULL, ?, NULL)",
               (unsettled.command_id, T0))
    summary = await prune(store, PAST_FACTS + 1000 * DAY_US)
    assert await ids(store, "effect_attempts", "attempt_id") == {
        "A-unknown", "A-no-outcome", "B-ok"}
    assert await ids(store, "result_receipts", "state") == {"pending"}
    # The settled command's work went; the unsettled one's stayed, with its fact.
    assert await ids(store, "work_items", "work_id") == {unsettled.work_id}
    assert summary["tables"]["effect_attempts"]["pruned"] == 2
    # The settled command keeps an attempt of unknown outcome; the other is open.
    assert await count(store, "external_commands") == 2


async def test_batches_respect_the_byte_budget(store: WorkStore) -> None:
    await _finished(store, 6, payload='{"big": "' + "x" * 3000 + '"}')
    await store.retention_lease_acquire(LeaseParams(holder="a", token="t1", ttl_us=60 * SEC,
                                                    sweep_interval_us=DAY_US), PAST_WORK)
    (rule,) = [r for r in RULES if r.name == "work_items"]
    cut = Cutoffs(work_us=PAST_WORK - 30 * DAY_US, facts_us=PAST_WORK - 400 * DAY_US)
    batch = await store.retention_prune_batch(BatchParams(
        rule=rule, partition="succeeded", cursor=None, token="t1", cutoffs=cut,
        batch_rows=50, batch_bytes=8000, ttl_us=60 * SEC), lambda: PAST_WORK)
    # ~3,520 bytes a row: two fit in 8,000.
    assert (batch.deleted, batch.exhausted) == (2, False)
    assert await count(store, "work_items") == 4


async def test_one_pruner_at_a_time_and_a_stale_one_deletes_nothing(
    database: FreshDatabase,
) -> None:
    a = await database.open_store()
    b = await database.open_store()
    await _finished(a, 10)
    lease = LeaseParams(holder="a", token="ta", ttl_us=60 * SEC, sweep_interval_us=DAY_US)
    won = await a.retention_lease_acquire(lease, PAST_WORK)
    assert isinstance(won, LeaseGranted)
    busy = await b.retention_lease_acquire(attrs.evolve(lease, holder="b", token="tb"),
                                           PAST_WORK + SEC)
    assert isinstance(busy, LeaseHeld) and busy.holder == "a"
    (rule,) = [r for r in RULES if r.name == "work_items"]
    cut = Cutoffs(work_us=PAST_WORK - 30 * DAY_US, facts_us=PAST_WORK - 400 * DAY_US)

    def batch(token: str) -> BatchParams:
        return BatchParams(rule=rule, partition="succeeded", cursor=None, token=token,
                           cutoffs=cut, batch_rows=3, batch_bytes=8_000_000,
                           ttl_us=60 * SEC)

    # B never won: its batches are refused and delete nothing.
    with pytest.raises(RetentionLeaseLost):
        await b.retention_prune_batch(batch("tb"), lambda: PAST_WORK + SEC)
    assert (await a.retention_prune_batch(batch("ta"), lambda: PAST_WORK + SEC)).deleted == 3
    # A pauses past its lease; B takes over; A (the zombie) can delete nothing more.
    later = PAST_WORK + 2 * 60 * SEC
    taken = await b.retention_lease_acquire(attrs.evolve(lease, holder="b", token="tb2"),
                                            later)
    assert isinstance(taken, LeaseGranted) and taken.epoch == won.epoch + 1
    with pytest.raises(RetentionLeaseLost):
        await a.retention_prune_batch(batch("ta"), lambda: later)
    assert await count(a, "work_items") == 7
    assert (await b.retention_prune_batch(batch("tb2"), lambda: later)).deleted == 3
    # A's release of a lease it lost changes nothing.
    assert not await a.retention_lease_release(token="ta", summary={}, now_us=later)
    status = await a.retention_status()
    assert status is not None and status.holder == "b"


# ---------------------------------------------------------------- ingress receipts

async def test_event_dedup_lasts_exactly_as_long_as_the_receipt_that_brought_the_event(
        store: WorkStore) -> None:
    """Events unique by L1 identity (issue 10 item 3) are not a cache: an event's identity
    key is its NormalizedEvent's, deleted only with its receipt, in the transaction that
    prunes it. So while the first receipt's dedup holds, its events' dedup holds too (a
    later receipt repeating one creates nothing for it), and neither ends before the
    other."""
    first = receipt(1)
    rebatched = receipt(2, at_us=T0 + 10 * DAY_US)
    for r in (first, rebatched):
        await store.ingress_receipt_insert(r, T0)
    assert await store.ingress_materialize(materialization(first, identities=["ev:1", "ev:2"]),
                                           T0)
    items = (await claim(store, family=INBOUND_APPLY_FAMILY, limit=10)).claimed
    for item in items:
        assert (await finalize(store, item, Succeeded())).applied
    # Past the ingress horizon of the first receipt only: it and its events go together.
    await prune(store, T0 + (INGRESS_DAYS + 1) * DAY_US - 10 * DAY_US)
    assert await ids(store, "ingress_receipts", "receipt_id") == {
        first.receipt_id, rebatched.receipt_id}
    (done,) = await store.ingress_settle_counted(
        [materialization(rebatched, identities=["ev:2", "ev:3"])], T0)
    assert done.duplicate_events == 1   # the first receipt is kept: so is ev:2's dedup
    await prune(store, T0 + (INGRESS_DAYS + 1) * DAY_US)
    assert await ids(store, "ingress_receipts", "receipt_id") == {rebatched.receipt_id}
    # Both ended together: the first delivery again is a new receipt, its events new.
    again = receipt(3, key=first.dedup_key, at_us=T0 + (INGRESS_DAYS + 1) * DAY_US)
    assert (await store.ingress_receipt_insert(again, T0)).stored
    (done,) = await store.ingress_settle_counted(
        [materialization(again, identities=["ev:1", "ev:2"])], T0)
    assert done.duplicate_events == 0
    # ev:3 belongs to the re-batched receipt, still kept: still a duplicate.
    fourth = receipt(4, at_us=T0 + (INGRESS_DAYS + 1) * DAY_US)
    await store.ingress_receipt_insert(fourth, T0)
    (done,) = await store.ingress_settle_counted(
        [materialization(fourth, identities=["ev:3"])], T0)
    assert done.duplicate_events == 1


async def test_ingress_receipts_go_after_their_retention_unless_unsettled_or_their_work_is_live(
        store: WorkStore) -> None:
    """Ingress receipts are pruned by the fenced pruner (issue 12 item 4), under their own
    horizon (``ingress.retention_days``: the end of exact dedup), with their events; a
    receipt still ``received`` or whose inbound work is still live is evidence and stays.
    (Before: the materializer deleted settled receipts past retention itself, outside the
    lease and unseen in the retention figures, and with them the raw delivery of work that
    was still retrying.)"""
    done, unsettled, live = receipt(1), receipt(2), receipt(3)
    young = receipt(4, at_us=T0 + 10 * DAY_US)
    for r in (done, unsettled, live, young):
        await store.ingress_receipt_insert(r, T0)
    for r in (done, live, young):
        assert await store.ingress_materialize(materialization(r, events=2), T0)
    # The work of ``done`` finishes; that of ``live`` fails and retries.
    items = (await claim(store, family=INBOUND_APPLY_FAMILY, limit=10)).claimed
    events = {e.work_id: r.receipt_id for r in (done, live, young)
              for e in await store.ingress_events_of(r.receipt_id)}
    for item in items:
        outcome = RetryLater("flaky") if events[item.work_id] == live.receipt_id else Succeeded()
        assert (await finalize(store, item, outcome)).applied
    metrics = Metrics()
    summary = await prune(store, T0 + (INGRESS_DAYS + 1) * DAY_US, metrics=metrics)
    assert await ids(store, "ingress_receipts", "receipt_id") == {
        unsettled.receipt_id, live.receipt_id, young.receipt_id}
    assert await store.ingress_events_of(done.receipt_id) == []
    assert len(await store.ingress_events_of(live.receipt_id)) == 2
    assert summary["tables"]["ingress_receipts"]["pruned"] == 1
    assert ('integrationd_retention_pruned_rows_total{table="ingress_receipts"} 1.0'
            in metrics.render().decode())
    # Dedup ended for the pruned one only: its redelivery is a new receipt.
    assert (await store.ingress_receipt_insert(receipt(1), T0 + 16 * DAY_US)).stored
    assert not (await store.ingress_receipt_insert(
        receipt(5, key=live.dedup_key), T0 + 16 * DAY_US)).stored
