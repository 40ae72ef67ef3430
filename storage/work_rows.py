"""WorkItem rows: the column list, row -> value mapping, and SQL fragments.

Rows become :class:`WorkItem` values only here (``from_row``), so no other
module depends on column order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from daemon.core.states import LANE_BLOCKING, WorkState
from daemon.core.work import Fence, WorkItem
from storage.port import Row

WORK_COLUMNS: tuple[str, ...] = (
    "work_id",
    "family",
    "org_id",
    "app_installation_id",
    "subject_kind",
    "subject_id",
    "definition_ref",
    "catalog_revision",
    "catalog_digest",
    "payload",
    "payload_schema_version",
    "engine_capability_version",
    "queue_class",
    "source_lane",
    "source_seq",
    "target_lane",
    "state",
    "run_after_us",
    "attempt",
    "max_attempts",
    "lease_owner",
    "lease_token",
    "lease_until_us",
    "ownership_epoch",
    "cancel_requested",
    "rollback_execution_fence_id",
    "legacy_outcome_receipt_version",
    "legacy_outcome_receipt_digest",
    "terminal_outcome",
    "failure_class",
    "operator_summary",
    "dedupe_key",
    "replay_of",
    "created_at_us",
    "updated_at_us",
)
SELECT_WORK = "SELECT " + ", ".join(WORK_COLUMNS) + " FROM work_items"

_INT_COLUMNS = frozenset(
    {
        "catalog_revision",
        "payload_schema_version",
        "engine_capability_version",
        "source_seq",
        "run_after_us",
        "attempt",
        "max_attempts",
        "lease_until_us",
        "ownership_epoch",
        "legacy_outcome_receipt_version",
        "created_at_us",
        "updated_at_us",
    }
)


def from_row(row: Row) -> WorkItem:
    values: dict[str, Any] = {}
    for name, value in zip(WORK_COLUMNS, row, strict=True):
        if value is not None and name in _INT_COLUMNS:
            value = int(value)
        values[name] = value
    values["state"] = WorkState(values["state"])
    values["cancel_requested"] = bool(values["cancel_requested"])
    return WorkItem(**values)


def placeholders(n: int) -> str:
    """``?, ?, ?`` for an IN list of ``n`` values."""
    if n < 1:
        raise ValueError("an IN list needs at least one value")
    return ", ".join("?" * n)


def in_states(states: Iterable[WorkState]) -> str:
    """A literal ``IN ('a', 'b')`` list: state names are our constants, never input."""
    return "(" + ", ".join(f"'{s.value}'" for s in sorted(states)) + ")"


def fence_predicate(fences: Sequence[Fence]) -> tuple[str, list[Any]]:
    """``work_id IN (...) AND ((id, token, epoch) = ... OR ...)`` for a batch of fences.

    The ``IN`` list lets every backend use the primary key; the OR of exact
    triples is the fence itself (SQLite has no row-value ``IN`` list).
    """
    ids = [f.work_id for f in fences]
    triples = " OR ".join(
        "(work_id = ? AND lease_token = ? AND ownership_epoch = ?)" for _ in fences
    )
    params: list[Any] = list(ids)
    for f in fences:
        params.extend((f.work_id, f.lease_token, f.ownership_epoch))
    return f"work_id IN ({placeholders(len(ids))}) AND ({triples})", params


LANE_BLOCKING_SQL = in_states(LANE_BLOCKING)


# Newest-first listings, keyset-paged on work_id. Each entry is an index whose leading
# columns, fixed by the filter, are followed by work_id: the page reads that index
# backwards from the cursor and stops at the page size. Two things make the engine do
# so: the ORDER BY names those columns before work_id (the same order, since they are
# fixed), and each is bound as a closed range (``c >= ? AND c <= ?``) rather than
# ``c = ?``, because MariaDB drops an equality-bound column from the ORDER BY and then
# prefers walking the primary key from the newest id: at a year of history that walk
# went through every newer row of other states (seconds per page; bench/bigtables.py).
# Most selective first: a subject's or a lane's items are few, a state's are many.
_LISTING_INDEXES: tuple[tuple[str, ...], ...] = (
    ("subject_id",),  # work_items_subject
    ("target_lane",),  # work_items_target_lane
    ("state", "failure_class"),  # work_items_dead_class_recent
    ("org_id", "state"),  # work_items_org
    ("state", "family"),  # work_items_state_family_id
    ("state",),  # work_items_state_recent
    ("org_id",),  # work_items_org_recent
    ("family",),  # work_items_family_recent
)


def newest_first(equal: Sequence[tuple[str, Any]]) -> tuple[list[str], list[Any], str]:
    """(clauses, params, ORDER BY) for a newest-first page filtered by ``column = value``
    pairs (column names are our constants, never input)."""
    bound = {c for c, _ in equal}
    chosen: tuple[str, ...] = ()
    for columns in _LISTING_INDEXES:
        if set(columns) <= bound:
            chosen = columns
            break
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in equal:
        if column in chosen:
            clauses.append(f"{column} >= ? AND {column} <= ?")
            params.extend((value, value))
        else:
            clauses.append(f"{column} = ?")
            params.append(value)
    order = "ORDER BY " + ", ".join(f"{c} DESC" for c in (*chosen, "work_id"))
    return clauses, params, order
