"""Retention rules, declared per table: what is old, in what order to scan, what to re-check.

A rule is data plus one guard. The pruner (:mod:`storage.retention.prune`) renders the
rule into two statements, the same for every rule:

* a keyset scan ``SELECT order columns, age, size, guard columns FROM table WHERE
  [partition = ?] AND where AND age < cutoff AND <after the cursor> ORDER BY order
  columns LIMIT n`` that an index on ``(partition, order columns)`` serves as a range;
* ``DELETE FROM table WHERE <key in the pruned rows> AND where AND age < cutoff``: the
  constant predicate is re-checked by the statement that deletes.

The guard reads whatever else it needs in the same transaction and answers one
:mod:`daemon.core.retention` verdict per row. A table joins retention by adding a rule to
:data:`RULES` (:func:`register_rule`). A rule may name dependent rows in other tables
(an ingress receipt's normalized events), deleted with their row.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import attrs

from daemon.core import retention as core
from daemon.core.retention import Cutoffs, Horizon, Verdict
from daemon.core.states import TERMINAL, WorkState
from storage.port import Row, SqlTx
from storage.work_rows import in_states, placeholders

Guard = Callable[[SqlTx, Sequence[Row], Cutoffs], Awaitable[list[Verdict]]]


@attrs.frozen(kw_only=True)
class RetentionRule:
    """One keyset scan over one table (``name`` is unique; ``table`` labels metrics)."""

    name: str
    table: str
    horizon: Horizon
    age_column: str  # compared with the horizon's cutoff (epoch us)
    # The scan order, served by an index; the key columns delete a row.
    order_columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    # Columns the guard reads from each candidate, after the order, age and size ones.
    guard_columns: tuple[str, ...]
    # Text bytes of a row (the transaction-size budget), an SQL expression.
    size_sql: str
    # Constant predicate, re-checked by the DELETE (our constants only, never input).
    where: str
    guard: Guard
    # ``partition_column = ?`` for each value, each scanned with its own cursor.
    partition_column: str | None = None
    partitions: tuple[str, ...] = ()
    # The first order column is a ULID (time-ordered id): rows created after the cutoff
    # cannot be past it, so the scan stops below ``ulid_floor(cutoff)``.
    ulid_order: bool = False
    # Rows of other tables that belong to a pruned row, as (table, column holding its
    # key): deleted in the same transaction once their row is gone (single-column keys).
    dependents: tuple[tuple[str, str], ...] = ()

    def scans(self) -> tuple[str | None, ...]:
        return self.partitions or (None,)

    def cursor_key(self, partition: str | None) -> str:
        return self.name if partition is None else f"{self.name}:{partition}"


RULES: list[RetentionRule] = []


def register_rule(rule: RetentionRule) -> RetentionRule:
    """Add a rule (at import time); a second rule of the same name is a bug."""
    if any(r.name == rule.name for r in RULES):
        raise ValueError(f"retention rule {rule.name!r} is already registered")
    RULES.append(rule)
    return rule


def pruned_tables() -> tuple[str, ...]:
    """Every table some rule prunes (the metric's label values)."""
    return tuple(dict.fromkeys(r.table for r in RULES))


# ---------------------------------------------------------------- shared reads

_LIVE = in_states(set(WorkState) - TERMINAL)


async def _ids(tx: SqlTx, sql: str, values: Sequence[str]) -> set[str]:
    if not values:
        return set()
    unique = sorted(set(values))
    rows = await tx.fetchall(sql.format(marks=placeholders(len(unique))), unique)
    return {str(r[0]) for r in rows}


async def _settlements(tx: SqlTx, command_ids: Sequence[str]) -> dict[str, str]:
    if not command_ids:
        return {}
    unique = sorted(set(command_ids))
    rows = await tx.fetchall(
        "SELECT command_id, settlement FROM external_commands"
        f" WHERE command_id IN ({placeholders(len(unique))})", unique)
    return {str(c): str(s) for c, s in rows}


async def _open_repairs(tx: SqlTx, command_ids: Sequence[str]) -> set[str]:
    return await _ids(tx, "SELECT repair_of FROM external_commands WHERE repair_of IN"
                          " ({marks}) AND settlement = 'open'", command_ids)


async def _live_work_of(tx: SqlTx, subject_kind: str, subject_ids: Sequence[str]) -> set[str]:
    return await _ids(tx, "SELECT subject_id FROM work_items WHERE subject_id IN ({marks})"
                          f" AND subject_kind = '{subject_kind}' AND state IN {_LIVE}",
                      subject_ids)


# Candidate rows: order columns, then age, then size, then the guard columns.
def _guard_cols(rule_order: int, row: Row) -> Row:
    return row[rule_order + 2:]


# ---------------------------------------------------------------- work_items

_ITEM_ORDER = 1  # (work_id)


async def _work_item_guard(tx: SqlTx, rows: Sequence[Row], cut: Cutoffs) -> list[Verdict]:
    # guard columns: dedupe_key, state, replay_of, subject_kind, subject_id
    cols = [_guard_cols(_ITEM_ORDER, r) for r in rows]
    originals = await _ids(tx, "SELECT work_id FROM work_items WHERE work_id IN ({marks})",
                           [str(c[2]) for c in cols if c[2] is not None])
    commands = [str(c[4]) for c in cols if c[3] == "command"]
    settlements = await _settlements(tx, commands)
    repairs = await _open_repairs(tx, commands)
    verdicts: list[Verdict] = []
    for row, c in zip(rows, cols, strict=True):
        is_command = c[3] == "command"
        verdicts.append(core.work_item_verdict(core.TerminalItemFacts(
            updated_at_us=int(row[_ITEM_ORDER]),
            has_dedupe_key=c[0] is not None,
            legacy_reconciled=c[1] == WorkState.RECONCILED_LEGACY_TERMINAL.value,
            replay_original_exists=c[2] is not None and str(c[2]) in originals,
            command_settlement=settlements.get(str(c[4])) if is_command else None,
            command_missing=is_command and str(c[4]) not in settlements,
            open_repair=is_command and str(c[4]) in repairs,
        ), cut))
    return verdicts


_ITEM_COMMON = {
    "table": "work_items",
    "age_column": "updated_at_us",
    "order_columns": ("work_id",),
    "key_columns": ("work_id",),
    "guard_columns": ("dedupe_key", "state", "replay_of", "subject_kind", "subject_id"),
    "size_sql": "LENGTH(payload) + COALESCE(LENGTH(operator_summary), 0)",
    "guard": _work_item_guard,
    "partition_column": "state",
    "ulid_order": True,
}

register_rule(RetentionRule(
    name="work_items", horizon=Horizon.WORK,
    # Items with a dedup identity wait for the facts horizon (the next rule).
    where=f"state IN {in_states(TERMINAL)} AND dedupe_key IS NULL",
    partitions=tuple(sorted(s.value for s in TERMINAL
                            if s is not WorkState.RECONCILED_LEGACY_TERMINAL)),
    **_ITEM_COMMON,  # type: ignore[arg-type]
))
register_rule(RetentionRule(
    name="work_items_facts", horizon=Horizon.FACTS,
    where=f"state IN {in_states(TERMINAL)}",
    partitions=tuple(sorted(s.value for s in TERMINAL)),
    **_ITEM_COMMON,  # type: ignore[arg-type]
))


# ---------------------------------------------------------------- work_executions

async def _execution_guard(tx: SqlTx, rows: Sequence[Row], cut: Cutoffs) -> list[Verdict]:
    live = await _ids(tx, f"SELECT work_id FROM work_items WHERE work_id IN ({{marks}})"
                          f" AND state IN {_LIVE}", [str(r[1]) for r in rows])
    return [core.execution_verdict(core.ExecutionFacts(
        finished_at_us=int(r[0]), work_live=str(r[1]) in live), cut) for r in rows]


register_rule(RetentionRule(
    name="work_executions", table="work_executions", horizon=Horizon.WORK,
    age_column="finished_at_us",
    order_columns=("finished_at_us", "work_id", "ownership_epoch"),
    key_columns=("work_id", "ownership_epoch"),
    guard_columns=(), size_sql="0", where="1 = 1", guard=_execution_guard,
))


# ---------------------------------------------------------------- effect_attempts

async def _attempt_guard(tx: SqlTx, rows: Sequence[Row], cut: Cutoffs) -> list[Verdict]:
    # order (finished_at_us, attempt_id); guard columns: command_id, outcome, disposition
    commands = [str(r[4]) for r in rows]
    settlements = await _settlements(tx, commands)
    live = await _live_work_of(tx, "command", commands)
    repairs = await _open_repairs(tx, commands)
    return [core.attempt_verdict(core.AttemptFacts(
        finished_at_us=None if r[0] is None else int(r[0]),
        outcome=None if r[5] is None else str(r[5]),
        disposition=None if r[6] is None else str(r[6]),
        command_settlement=settlements.get(str(r[4])),
        command_work_live=str(r[4]) in live, open_repair=str(r[4]) in repairs,
    ), cut) for r in rows]


register_rule(RetentionRule(
    name="effect_attempts", table="effect_attempts", horizon=Horizon.WORK,
    age_column="finished_at_us", order_columns=("finished_at_us", "attempt_id"),
    key_columns=("attempt_id",), guard_columns=("command_id", "outcome", "disposition"),
    size_sql=("LENGTH(safe_headers) + LENGTH(pre_dispatch_evidence)"
              " + COALESCE(LENGTH(provider_evidence), 0)"
              " + COALESCE(LENGTH(disposition_note), 0)"),
    # Never an attempt without an outcome, nor an unknown one nobody disposed of.
    where=("outcome IS NOT NULL AND (outcome <> 'OUTCOME_UNKNOWN'"
           " OR disposition IS NOT NULL)"),
    guard=_attempt_guard,
))


# ---------------------------------------------------------------- result_receipts

async def _receipt_guard(tx: SqlTx, rows: Sequence[Row], cut: Cutoffs) -> list[Verdict]:
    # order (confirmed_at_us, command_id); guard columns: state
    commands = [str(r[1]) for r in rows]
    live = await _live_work_of(tx, "receipt", commands)
    repairs = await _open_repairs(tx, commands)
    settlements = await _settlements(tx, commands)
    return [core.receipt_verdict(core.ReceiptFacts(
        state=str(r[4]), confirmed_at_us=None if r[0] is None else int(r[0]),
        receipt_work_live=str(r[1]) in live, open_repair=str(r[1]) in repairs,
        command_retired=settlements.get(str(r[1])) == "retired",
    ), cut) for r in rows]


register_rule(RetentionRule(
    name="result_receipts", table="result_receipts", horizon=Horizon.WORK,
    age_column="confirmed_at_us", order_columns=("confirmed_at_us", "command_id"),
    key_columns=("command_id",), guard_columns=("state",),
    size_sql="LENGTH(canonical_result)", where="state = 'confirmed'", guard=_receipt_guard,
))


# ---------------------------------------------------------------- handoff_admissions

async def _admission_guard(tx: SqlTx, rows: Sequence[Row], cut: Cutoffs) -> list[Verdict]:
    # order (created_at_us, handoff_key); guard columns: admission, command_id
    settlements = await _settlements(tx, [str(r[5]) for r in rows if r[5] is not None])
    return [core.admission_verdict(core.AdmissionFacts(
        admission=str(r[4]), created_at_us=int(r[0]),
        command_settlement=None if r[5] is None else settlements.get(str(r[5])),
    ), cut) for r in rows]


register_rule(RetentionRule(
    name="handoff_admissions", table="handoff_admissions", horizon=Horizon.FACTS,
    age_column="created_at_us", order_columns=("created_at_us", "handoff_key"),
    key_columns=("handoff_key",), guard_columns=("admission", "command_id"),
    size_sql="COALESCE(LENGTH(receipt_json), 0)", where="1 = 1", guard=_admission_guard,
))


# ---------------------------------------------------------------- external_commands

_COMMAND_ORDER = 2  # (updated_at_us, command_id), within a settlement partition


async def _older_on_record(tx: SqlTx, records: dict[tuple[str, str, str], int]
                           ) -> dict[tuple[str, str, str], int]:
    """For each (object, id, binding) record: the creation time of its oldest stored
    command, older than the given time, that may still be replayed or repaired (open or
    retired, or with a WorkItem): the newer commands of the record must stay, since a
    newer success is what refuses that replay or repair (storage/supersede.py). Read on
    the ``external_commands_local`` index, one range per record."""
    if not records:
        return {}
    keys = sorted(records)
    match = " OR ".join(["(local_object = ? AND local_id = ? AND binding_id = ?"
                         " AND created_at_us < ?)"] * len(keys))
    rows = await tx.fetchall(
        "SELECT local_object, local_id, binding_id, MIN(created_at_us) FROM external_commands c"
        f" WHERE ({match}) AND (settlement IN ('open', 'retired') OR EXISTS (SELECT 1 FROM"
        " work_items w WHERE w.subject_id = c.command_id AND w.subject_kind = 'command'))"
        " GROUP BY local_object, local_id, binding_id",
        [v for key in keys for v in (*key, records[key])])
    return {(str(a), str(b), str(c)): int(m) for a, b, c, m in rows}


async def _command_guard(tx: SqlTx, rows: Sequence[Row], cut: Cutoffs) -> list[Verdict]:
    # guard columns: settlement, handoff_key, repair_of, created_at_us, local_object,
    # local_id, binding_id (after the order, age and size columns)
    cols = [_guard_cols(_COMMAND_ORDER, r)[1:] for r in rows]
    settlement = [str(_guard_cols(_COMMAND_ORDER, r)[0]) for r in rows]
    ids = [str(r[1]) for r in rows]
    keys = [str(c[0]) for c in cols if c[0] is not None]
    admitted = await _ids(tx, "SELECT handoff_key FROM handoff_admissions"
                              " WHERE handoff_key IN ({marks})", keys)
    receipts: dict[str, str] = {str(c): str(st) for c, st in await tx.fetchall(
        f"SELECT command_id, state FROM result_receipts WHERE command_id IN"
        f" ({placeholders(len(ids))})", ids)} if ids else {}
    with_work = await _ids(tx, "SELECT subject_id FROM work_items WHERE subject_id IN"
                               " ({marks}) AND subject_kind IN ('command', 'receipt')", ids)
    with_attempts = await _ids(tx, "SELECT command_id FROM effect_attempts"
                                   " WHERE command_id IN ({marks})", ids)
    repairs = await _open_repairs(tx, ids)
    originals = await _ids(tx, "SELECT command_id FROM external_commands"
                               " WHERE command_id IN ({marks})",
                           [str(c[1]) for c in cols if c[1] is not None])
    newest: dict[tuple[str, str, str], int] = {}
    for c in cols:
        record = (str(c[3]), str(c[4]), str(c[5]))
        newest[record] = max(newest.get(record, 0), int(c[2]))
    oldest = await _older_on_record(tx, newest)
    verdicts: list[Verdict] = []
    for row, c, settled in zip(rows, cols, settlement, strict=True):
        command_id = str(row[1])
        receipt = receipts.get(command_id)
        verdicts.append(core.command_verdict(core.CommandFacts(
            settlement=settled, settled_at_us=int(row[0]),
            handed_off=c[0] is not None,
            admission_exists=c[0] is not None and str(c[0]) in admitted,
            receipt_state=receipt,
            work_exists=command_id in with_work, attempts_exist=command_id in with_attempts,
            open_repair=command_id in repairs,
            repair_original_exists=c[1] is not None and str(c[1]) in originals,
            older_on_record=oldest.get((str(c[3]), str(c[4]), str(c[5])),
                                       int(c[2])) < int(c[2]),
        ), cut))
    return verdicts


register_rule(RetentionRule(
    name="external_commands", table="external_commands", horizon=Horizon.COMMANDS,
    age_column="updated_at_us", order_columns=("updated_at_us", "command_id"),
    key_columns=("command_id",),
    guard_columns=("settlement", "handoff_key", "repair_of", "created_at_us", "local_object",
                   "local_id", "binding_id"),
    size_sql="LENGTH(frozen_request)", where="settlement <> 'open'", guard=_command_guard,
    # Scanned per settlement on external_commands_retention (migration 0028).
    partition_column="settlement", partitions=("no_effect", "retired", "succeeded"),
))


# ---------------------------------------------------------------- handoff_quarantine

async def _quarantine_guard(tx: SqlTx, rows: Sequence[Row], cut: Cutoffs) -> list[Verdict]:
    # order (quarantine_id: a ULID of its time), age at_us
    return [core.quarantine_verdict(core.QuarantineFacts(at_us=int(r[1])), cut) for r in rows]


register_rule(RetentionRule(
    name="handoff_quarantine", table="handoff_quarantine", horizon=Horizon.QUARANTINE,
    age_column="at_us", order_columns=("quarantine_id",), key_columns=("quarantine_id",),
    guard_columns=(), size_sql="0", where="1 = 1", guard=_quarantine_guard, ulid_order=True,
))


# ---------------------------------------------------------------- ingress_receipts

async def _ingress_receipt_guard(tx: SqlTx, rows: Sequence[Row], cut: Cutoffs
                                 ) -> list[Verdict]:
    # order (received_at_us, receipt_id); guard columns: state
    live = await _ids(
        tx, "SELECT DISTINCT e.receipt_id FROM normalized_events e"
            " JOIN work_items w ON w.work_id = e.work_id"
            f" WHERE e.receipt_id IN ({{marks}}) AND w.state IN {_LIVE}",
        [str(r[1]) for r in rows])
    return [core.ingress_receipt_verdict(core.IngressReceiptFacts(
        state=str(r[4]), received_at_us=int(r[0]), work_live=str(r[1]) in live,
    ), cut) for r in rows]


register_rule(RetentionRule(
    name="ingress_receipts", table="ingress_receipts", horizon=Horizon.INGRESS,
    age_column="received_at_us", order_columns=("received_at_us", "receipt_id"),
    key_columns=("receipt_id",), guard_columns=("state",),
    # Its events repeat (part of) the body: counted twice, so the budget stays an upper bound.
    size_sql=("2 * LENGTH(body_b64) + LENGTH(headers_json)"
              " + COALESCE(LENGTH(quarantine_detail), 0)"),
    where="state <> 'received'", guard=_ingress_receipt_guard,
    dependents=(("normalized_events", "receipt_id"),),
))
