"""Rotated-out webhook secrets' retirement state (migration ``webhook_secret_retirements``),
one row per route and secret generation, moved by compare-and-swap on ``row_version`` in
the caller's (fenced) transaction. No secret is ever stored here: the row names the
route and the generation whose *previous* secret it is about."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

from storage.port import DuplicateKey, SqlTx, WorkConflict

_COLUMNS = ("route, secret_generation, state, watch_since_us, check_at_us, retired_at_us,"
            " evidence, row_version, updated_at_us")


@attrs.frozen(kw_only=True)
class RetirementRow:
    route: str
    secret_generation: int
    state: str  # watching | retired
    watch_since_us: int
    check_at_us: int
    retired_at_us: int | None = None
    evidence: Mapping[str, object] = attrs.field(factory=dict)
    row_version: int = 0  # 0: no row yet
    updated_at_us: int = 0


def _from_row(r: Sequence[object]) -> RetirementRow:
    return RetirementRow(
        route=str(r[0]), secret_generation=int(str(r[1])), state=str(r[2]),
        watch_since_us=int(str(r[3])), check_at_us=int(str(r[4])),
        retired_at_us=None if r[5] is None else int(str(r[5])),
        evidence=json.loads(str(r[6])), row_version=int(str(r[7])),
        updated_at_us=int(str(r[8])))


def _evidence(row: RetirementRow) -> str:
    return json.dumps(dict(row.evidence), sort_keys=True, separators=(",", ":"))


async def read_retirement(tx: SqlTx, route: str, secret_generation: int
                          ) -> RetirementRow | None:
    rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM webhook_secret_retirements"
                             " WHERE route = ? AND secret_generation = ?",
                             (route, secret_generation))
    return _from_row(rows[0]) if rows else None


async def read_retirements(tx: SqlTx) -> list[RetirementRow]:
    rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM webhook_secret_retirements"
                             " ORDER BY route, secret_generation", ())
    return [_from_row(r) for r in rows]


async def retired_previous_secrets(tx: SqlTx) -> set[tuple[str, int]]:
    """(route, secret generation) of every route whose previous secret is retired."""
    rows = await tx.fetchall("SELECT route, secret_generation FROM webhook_secret_retirements"
                             " WHERE state = ?", ("retired",))
    return {(str(r[0]), int(str(r[1]))) for r in rows}


async def write_retirement(tx: SqlTx, before: RetirementRow | None, after: RetirementRow,
                           now_us: int) -> RetirementRow:
    """Insert ``after`` (``before`` None) or move ``before`` (as read) to ``after``; a row
    that appeared or moved since it was read is a ``WorkConflict`` (nothing written)."""
    params = (after.state, after.watch_since_us, after.check_at_us, after.retired_at_us,
              _evidence(after))
    if before is None:
        try:
            await tx.execute(
                f"INSERT INTO webhook_secret_retirements ({_COLUMNS})"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
                (after.route, after.secret_generation, *params, now_us))
        except DuplicateKey:
            raise WorkConflict(f"secret retirement {after.route}/{after.secret_generation}"
                               " appeared concurrently") from None
        return attrs.evolve(after, row_version=1, updated_at_us=now_us)
    if not await tx.execute(
        "UPDATE webhook_secret_retirements SET state = ?, watch_since_us = ?, check_at_us = ?,"
        " retired_at_us = ?, evidence = ?, row_version = row_version + 1, updated_at_us = ?"
        " WHERE route = ? AND secret_generation = ? AND row_version = ?",
        (*params, now_us, before.route, before.secret_generation, before.row_version),
    ):
        raise WorkConflict(f"secret retirement {before.route}/{before.secret_generation}"
                           " changed concurrently")
    return attrs.evolve(after, row_version=before.row_version + 1, updated_at_us=now_us)


async def delete_retirement(tx: SqlTx, before: RetirementRow) -> None:
    """Drop a watch (never a retirement: that one is final for its generation)."""
    if before.state == "retired":
        raise ValueError("a retired secret stays retired")
    if not await tx.execute(
            "DELETE FROM webhook_secret_retirements WHERE route = ? AND secret_generation = ?"
            " AND row_version = ?", (before.route, before.secret_generation,
                                     before.row_version)):
        raise WorkConflict(f"secret retirement {before.route}/{before.secret_generation}"
                           " changed concurrently")


async def last_previous_secret_receipt(tx: SqlTx, route: str, since_us: int,
                                       window_us: int) -> int | None:
    """When a delivery to ``route`` verified with an older secret than its newest last
    arrived, at or after ``since_us`` (None: none did), duplicates' copies included. A
    copy arrives within the provider's redelivery window (``window_us``) of the first
    copy's receipt, which bounds the scan of the route's receipts."""
    rows = await tx.fetchall(
        "SELECT MAX(previous_secret_at_us) FROM ingress_receipts WHERE route = ?"
        " AND received_at_us >= ? AND previous_secret_at_us >= ?",
        (route, since_us - window_us, since_us))
    return None if not rows or rows[0][0] is None else int(str(rows[0][0]))
