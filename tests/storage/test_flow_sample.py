"""The console's flow sample on every backend: counts per interval and end-to-end latency."""

from __future__ import annotations

from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.work import T0

MS = 1000


async def _command(tx: SqlTx, command_id: str, created_us: int) -> None:
    await tx.execute(
        "INSERT INTO external_commands (command_id, handoff_key, org_id, app_installation_id,"
        " runtime_capability_id, runtime_work_binding_digest, runtime_name, intent_id,"
        " intent_kind, operation, local_object, local_id, binding_id, binding_generation,"
        " catalog_revision, frozen_request, payload_digest, runtime_outbox_id, settlement,"
        " repair_of, created_at_us, updated_at_us) VALUES (?, ?, 'o', 'i', 'c', 'd', 'rt',"
        " ?, 'update', 'op', 'Lead', ?, 'b', 1, 1, '{}', 'sha256:x', ?, 'open', NULL, ?, ?)",
        (command_id, f"key-{command_id}", f"intent-{command_id}", f"lead-{command_id}",
         f"outbox-{command_id}", created_us, created_us))


async def _attempt(tx: SqlTx, attempt_id: str, outcome: str | None,
                   finished_us: int | None) -> None:
    await tx.execute(
        "INSERT INTO effect_attempts (attempt_id, command_id, work_id, ownership_epoch,"
        " lease_token, method, target_path, safe_headers, body_sha256, idempotency_key,"
        " pre_dispatch_evidence, dispatch_started_at_us, response_status, provider_evidence,"
        " outcome, failure_class, finished_at_us, disposition, disposition_note,"
        " disposition_by, disposition_at_us, row_version) VALUES (?, 'cmd', ?, 1, 't',"
        " 'PATCH', '/x', '{}', 'h', 'k', '{}', ?, NULL, NULL, ?, NULL, ?, NULL, NULL, NULL,"
        " NULL, 1)",
        (attempt_id, f"work-{attempt_id}", T0, outcome, finished_us))


async def _receipt(tx: SqlTx, command_id: str, created_us: int,
                   confirmed_us: int | None) -> None:
    await tx.execute(
        "INSERT INTO result_receipts (command_id, intent_id, result_format_version, remote_id,"
        " canonical_result, result_digest, state, last_error, created_at_us, confirmed_at_us)"
        " VALUES (?, ?, 2, 'r', '{}', 'sha256:y', ?, NULL, ?, ?)",
        (command_id, f"intent-{command_id}", "confirmed" if confirmed_us else "pending",
         created_us, confirmed_us))


async def test_flow_sample_counts_one_interval_and_measures_end_to_end(
        store: WorkStore) -> None:
    async def seed(tx: SqlTx) -> None:
        # Accepted at T0; provider answered 40 ms later; confirmed 100 ms after acceptance.
        for i in range(10):
            await _command(tx, f"c{i}", T0 + i * MS)
            await _receipt(tx, f"c{i}", T0 + i * MS + 40 * MS, T0 + i * MS + 100 * MS)
        # One slow one: answered after 2 s, confirmed after 3 s (inside the window too).
        await _command(tx, "slow", T0 - 2_900 * MS)
        await _receipt(tx, "slow", T0 - 900 * MS, T0 + 100 * MS)
        # Outside the window: accepted long before, confirmed long after, still pending.
        await _command(tx, "late", T0 - 60_000 * MS)
        await _receipt(tx, "late", T0 - 59_000 * MS, T0 + 5_000 * MS)
        await _command(tx, "open", T0 + 500 * MS)
        await _receipt(tx, "open", T0 + 600 * MS, None)
        for i, (outcome, at) in enumerate([("ACCEPTED", 50), ("ACCEPTED", 60),
                                           ("REJECTED", 70), ("OUTCOME_UNKNOWN", 80),
                                           ("ACCEPTED", 9_000), (None, None)]):
            await _attempt(tx, f"a{i}", outcome, T0 + at * MS if at is not None else None)

    await store.db.transact(seed, name="test.seed")
    sample = await store.flow_sample(T0, T0 + 1_000 * MS)
    assert sample.accepted == 11  # ten plus "open"; "slow" and "late" were accepted before
    assert sample.effects == (("ACCEPTED", 2), ("OUTCOME_UNKNOWN", 1), ("REJECTED", 1))
    assert sample.receipts_confirmed == 11
    assert sample.to_response.total == sample.to_receipt.total == 11
    p50_response = sample.to_response.percentile_ms(0.5)
    p50_receipt = sample.to_receipt.percentile_ms(0.5)
    assert p50_response is not None and 40 <= p50_response < 44
    assert p50_receipt is not None and 100 <= p50_receipt < 110
    p99 = sample.to_receipt.percentile_ms(0.99)
    assert p99 is not None and 3_000 <= p99 < 3_300

    empty = await store.flow_sample(T0 + 10_000 * MS, T0 + 11_000 * MS)
    assert (empty.accepted, empty.effects, empty.receipts_confirmed) == (0, (), 0)
    assert empty.to_receipt.percentile_ms(0.5) is None
