"""Conformance: retention prunes settled external commands and the handoff quarantine.

On every backend: a command goes only once it is settled, past the commands horizon, its
admission fact gone (the fact is what deduplicates a repeated handoff key), no WorkItem
or effect attempt of it left, no open repair of it, it is not a repair whose original is
still stored, its Runtime receipt is confirmed (or it owes none), and no older command of
its record is still stored. Each guard is shown refusing on its own. The quarantine
evidence goes after its own horizon.
"""

from __future__ import annotations

from typing import Any

import pytest

from daemon.core.retention import DAY_US, Cutoffs
from daemon.services.metrics import Metrics
from storage.effect_values import Admission
from storage.port import SqlTx
from storage.retention.prune import BatchParams, LeaseGranted, LeaseParams
from storage.retention.rules import RULES
from storage.work_store import WorkStore
from tests.support.commands import draft
from tests.support.retention import PAST_FACTS, count, ids, prune
from tests.support.work import SEC, T0

# Past the facts horizon (400 days) and the commands horizon (400 days) of T0.
LATER = PAST_FACTS + 2 * DAY_US  # a day after PAST_FACTS: a new sweep (scans restart)


async def _set(store: WorkStore, sql: str, params: tuple[Any, ...]) -> None:
    async def body(tx: SqlTx) -> None:
        await tx.execute(sql, params)

    await store.db.transact(body, name="test.set")


async def _command(store: WorkStore, intent: str, *, lead: str, settlement: str = "succeeded",
                   cancel_work: bool = True) -> str:
    """A handed-off command accepted at T0 and settled at T0 (its work cancelled)."""
    accepted = await store.command_accept(draft(intent, lead=lead), T0)
    assert accepted.command_id is not None and accepted.work_id is not None
    if cancel_work:
        await store.work_cancel(accepted.work_id, T0)
    await _set(store, "UPDATE external_commands SET settlement = ?, updated_at_us = ?"
                      " WHERE command_id = ?", (settlement, T0, accepted.command_id))
    return accepted.command_id


async def _receipt(store: WorkStore, command_id: str, state: str) -> None:
    confirmed = T0 if state == "confirmed" else None
    await _set(store, "INSERT INTO result_receipts (command_id, intent_id,"
                      " result_format_version, remote_id, canonical_result, result_digest,"
                      " state, last_error, created_at_us, confirmed_at_us) VALUES"
                      " (?, 'int', 1, 'r1', '{}', 'sha', ?, NULL, ?, ?)",
               (command_id, state, T0, confirmed))


async def _unknown_attempt(store: WorkStore, command_id: str) -> None:
    await _set(store,
               "INSERT INTO effect_attempts (attempt_id, command_id, work_id, ownership_epoch,"
               " lease_token, method, target_path, safe_headers, body_sha256,"
               " idempotency_key, pre_dispatch_evidence, dispatch_started_at_us, outcome,"
               " disposition, finished_at_us, row_version) VALUES ('A-unknown', ?, 'W', 1,"
               " 'tok', 'PATCH', '/x', '{}', 'sha', 'idem', '{}', ?, 'OUTCOME_UNKNOWN',"
               " NULL, ?, 0)", (command_id, T0, T0))


async def _kept(store: WorkStore, now_us: int) -> dict[str, int]:
    """One batch per settlement partition of the command rule: why rows were kept."""
    (rule,) = [r for r in RULES if r.name == "external_commands"]
    grant = await store.retention_lease_acquire(
        LeaseParams(holder="t", token="tk", ttl_us=60 * SEC, sweep_interval_us=DAY_US), now_us)
    assert isinstance(grant, LeaseGranted)
    cut = Cutoffs(work_us=now_us - 30 * DAY_US, facts_us=now_us - 400 * DAY_US,
                  commands_us=now_us - 400 * DAY_US)
    kept: dict[str, int] = {}
    for partition in rule.scans():
        batch = await store.retention_prune_batch(BatchParams(
            rule=rule, partition=partition, cursor=None, token="tk", cutoffs=cut,
            batch_rows=100, batch_bytes=8_000_000, ttl_us=60 * SEC), lambda: now_us)
        assert batch.exhausted and batch.deleted == 0, batch
        for reason, n in batch.kept.items():
            kept[reason] = kept.get(reason, 0) + n
    assert await store.retention_lease_release(token="tk", summary={}, now_us=now_us)
    return kept


async def test_a_settled_command_goes_with_its_fact_and_the_key_stays_deduplicated_until_then(
        store: WorkStore) -> None:
    gone = await _command(store, "int-gone", lead="lead-1")
    no_effect = await _command(store, "int-none", lead="lead-2", settlement="no_effect")
    # An older succeeded command of lead-1 (without work) can be neither replayed nor
    # repaired: it holds nothing back, and both of lead-1's go in the same pass.
    older = await _command(store, "int-older", lead="lead-1")
    await _set(store, "UPDATE external_commands SET created_at_us = ? WHERE command_id = ?",
               (T0 - SEC, older))
    # Within the commands (and facts) horizon, a repeat of the key still answers with the
    # command: the admission fact deduplicates it.
    metrics = Metrics()
    await prune(store, T0 + 399 * DAY_US)
    assert await ids(store, "external_commands", "command_id") == {gone, no_effect, older}
    again = await store.command_accept(draft("int-gone", lead="lead-1"), T0 + 399 * DAY_US)
    assert (again.admission, again.command_id, again.created) == (
        Admission.COMMAND_ACCEPTED, gone, False)
    # Past both horizons: the work, the admission fact and then the command go, in one pass.
    summary = await prune(store, PAST_FACTS, metrics=metrics)
    assert await count(store, "external_commands") == 0
    assert await count(store, "handoff_admissions") == 0
    assert await count(store, "work_items") == 0
    assert summary["tables"]["external_commands"]["pruned"] == 3
    assert summary["tables"]["external_commands"]["lag_s"] == pytest.approx(86_400, abs=2)
    assert ('integrationd_retention_pruned_rows_total{table="external_commands"} 3.0'
            in metrics.render().decode())
    status = await store.retention_status()
    assert status is not None
    assert status.last_pass["tables"]["external_commands"]["pruned"] == 3


async def test_each_command_guard_refuses_on_its_own(store: WorkStore) -> None:
    # An open command (its work cancelled): never.
    opened = await _command(store, "int-open", lead="lead-open", settlement="open")
    # Its admission fact is younger than the facts horizon.
    young_fact = await _command(store, "int-fact", lead="lead-fact")
    await _set(store, "UPDATE handoff_admissions SET created_at_us = ? WHERE command_id = ?",
               (LATER - 10 * DAY_US, young_fact))
    # Its WorkItem is still live.
    live_work = await _command(store, "int-work", lead="lead-work", cancel_work=False)
    # An attempt of it with an unknown outcome nobody disposed of.
    attempted = await _command(store, "int-attempt", lead="lead-attempt")
    await _unknown_attempt(store, attempted)
    # Its receipt is not confirmed yet.
    pending = await _command(store, "int-pending", lead="lead-pending")
    await _receipt(store, pending, "pending")
    # Retired without a receipt: the Runtime intent still blocks.
    owed = await _command(store, "int-owed", lead="lead-owed", settlement="retired")
    # A newer intent on the owed command's record: it is what refuses a repair of the
    # owed one from overwriting it.
    newer = await _command(store, "int-newer", lead="lead-owed")
    await _set(store, "UPDATE external_commands SET created_at_us = ? WHERE command_id = ?",
               (T0 + SEC, newer))
    # A newer intent on the live-work command's record: that succeeded command may still
    # be replayed (its WorkItem is stored), so this one stays too.
    newer_than_work = await _command(store, "int-newer-work", lead="lead-work")
    await _set(store, "UPDATE external_commands SET created_at_us = ? WHERE command_id = ?",
               (T0 + SEC, newer_than_work))
    # A repair of a retired original, with an open repair of its own.
    original = await _command(store, "int-orig", lead="lead-orig", settlement="retired")
    repair = await _command(store, "int-repair", lead="lead-repair", settlement="open")
    await _set(store, "UPDATE external_commands SET handoff_key = NULL, repair_of = ?"
                      " WHERE command_id = ?", (original, repair))
    # (The original's cancelled work would stay for the open repair too: delete it here, so
    # that the command's own open-repair guard is what is shown refusing.)
    await _set(store, "DELETE FROM work_items WHERE subject_id = ?", (original,))
    before = await ids(store, "external_commands", "command_id")
    await prune(store, PAST_FACTS)
    await prune(store, LATER)
    assert await ids(store, "external_commands", "command_id") == before
    # (Open commands are not even scanned: the rule's predicate names settled ones.)
    assert await _kept(store, LATER + DAY_US) == {
        "admission_fact": 1, "work_exists": 1, "attempts_exist": 1,
        "receipt_unconfirmed": 1, "receipt_owed": 1, "older_intent_on_record": 2,
        "open_repair": 1}
    # The repair settles (its result is the original's receipt, not confirmed yet): the
    # repair waits for its original (one repair per original: pruning it first would let
    # the original be repaired twice).
    await _set(store, "UPDATE external_commands SET settlement = 'succeeded', updated_at_us = ?"
                      " WHERE command_id = ?", (T0, repair))
    await _receipt(store, original, "pending")
    await prune(store, LATER + DAY_US)  # the repair's own (cancelled) work goes
    assert await _kept(store, LATER + DAY_US) == {
        "admission_fact": 1, "work_exists": 1, "attempts_exist": 1,
        "receipt_unconfirmed": 2, "receipt_owed": 1, "older_intent_on_record": 2,
        "repair_lineage": 1}
    # The Runtime confirms it: the original goes, then its repair. The receipt, the only
    # proof the retired original was answered, stayed while the original existed; it goes
    # on the next sweep.
    await _set(store, "UPDATE result_receipts SET state = 'confirmed', confirmed_at_us = ?"
                      " WHERE command_id = ?", (T0, original))
    summary = await prune(store, LATER + 2 * DAY_US)
    assert summary["tables"]["external_commands"]["pruned"] == 2
    assert await ids(store, "external_commands", "command_id") == before - {original, repair}
    assert await ids(store, "result_receipts", "command_id") == {pending, original}
    await prune(store, LATER + 4 * DAY_US)
    assert await ids(store, "result_receipts", "command_id") == {pending}
    assert await ids(store, "external_commands", "command_id") == before - {original, repair}
    assert opened and young_fact and live_work and attempted and owed and newer
    assert newer_than_work


async def test_the_quarantine_goes_after_its_own_horizon(store: WorkStore) -> None:
    accepted = await store.command_accept(draft("int-q"), T0)
    clash = await store.command_accept(draft("int-q", outbox="outbox-other"), T0)
    assert clash.admission is Admission.QUARANTINED
    late = await store.command_accept(draft("int-q", outbox="outbox-other"), T0 + 80 * DAY_US)
    assert late.admission is Admission.QUARANTINED
    metrics = Metrics()
    summary = await prune(store, T0 + 89 * DAY_US, metrics=metrics)
    assert await count(store, "handoff_quarantine") == 2
    summary = await prune(store, T0 + 91 * DAY_US, metrics=metrics)
    assert await count(store, "handoff_quarantine") == 1  # the later one stays
    assert summary["tables"]["handoff_quarantine"]["pruned"] == 1
    assert ('integrationd_retention_pruned_rows_total{table="handoff_quarantine"} 1.0'
            in metrics.render().decode())
    # The admission fact still deduplicates the key, and still quarantines a clash.
    again = await store.command_accept(draft("int-q", outbox="outbox-other"), T0 + 91 * DAY_US)
    assert again.admission is Admission.QUARANTINED
    assert (await store.command_accept(draft("int-q"), T0 + 91 * DAY_US)).command_id == \
        accepted.command_id
    await prune(store, T0 + 182 * DAY_US)  # both later ones (days 80 and 91) go
    assert await count(store, "handoff_quarantine") == 0
