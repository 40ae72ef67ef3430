"""Cursor reconciliation's storage: one cursor row per stream, moved by compare-and-swap
in the caller's (fenced) transaction, together with the WorkItems a page produced."""

from __future__ import annotations

import attrs

from daemon.core.cursor import Cursor
from storage.port import DuplicateKey, SqlTx, WorkConflict

_COLUMNS = ("stream_key, binding_id, resource, cursor_ns, cursor_text, cursor_id, runs,"
            " last_run_at_us, row_version, updated_at_us")


@attrs.frozen(kw_only=True)
class StreamState:
    stream_key: str
    binding_id: str
    resource: str
    cursor: Cursor | None = None
    runs: int = 0
    last_run_at_us: int | None = None
    row_version: int = 0  # 0: no row yet


async def read_stream(tx: SqlTx, stream_key: str, binding_id: str,
                      resource: str) -> StreamState:
    rows = await tx.fetchall(
        f"SELECT {_COLUMNS} FROM reconcile_cursors WHERE stream_key = ?", (stream_key,))
    if not rows:
        return StreamState(stream_key=stream_key, binding_id=binding_id, resource=resource)
    r = rows[0]
    cursor = None if r[3] is None else Cursor(updated_ns=int(r[3]), updated_at=str(r[4]),
                                              record_id=str(r[5]))
    return StreamState(stream_key=str(r[0]), binding_id=str(r[1]), resource=str(r[2]),
                       cursor=cursor, runs=int(r[6]),
                       last_run_at_us=None if r[7] is None else int(r[7]),
                       row_version=int(r[8]))


async def write_stream(tx: SqlTx, before: StreamState, *, cursor: Cursor | None,
                       runs: int, last_run_at_us: int | None, now_us: int) -> StreamState:
    """Replace ``before`` (as read in this claim); a concurrent change is a WorkConflict."""
    ns = None if cursor is None else cursor.updated_ns
    text = None if cursor is None else cursor.updated_at
    rid = None if cursor is None else cursor.record_id
    if before.row_version == 0:
        try:
            await tx.execute(
                f"INSERT INTO reconcile_cursors ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
                (before.stream_key, before.binding_id, before.resource, ns, text, rid, runs,
                 last_run_at_us, now_us))
        except DuplicateKey:
            raise WorkConflict(f"reconcile stream {before.stream_key} appeared"
                               " concurrently") from None
    elif not await tx.execute(
        "UPDATE reconcile_cursors SET cursor_ns = ?, cursor_text = ?, cursor_id = ?, runs = ?,"
        " last_run_at_us = ?, row_version = row_version + 1, updated_at_us = ?"
        " WHERE stream_key = ? AND row_version = ?",
        (ns, text, rid, runs, last_run_at_us, now_us, before.stream_key, before.row_version),
    ):
        raise WorkConflict(f"reconcile stream {before.stream_key} changed concurrently")
    return attrs.evolve(before, cursor=cursor, runs=runs, last_run_at_us=last_run_at_us,
                        row_version=before.row_version + 1)


async def list_streams(tx: SqlTx) -> list[StreamState]:
    rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM reconcile_cursors ORDER BY stream_key")
    out = []
    for r in rows:
        cursor = None if r[3] is None else Cursor(updated_ns=int(r[3]), updated_at=str(r[4]),
                                                  record_id=str(r[5]))
        out.append(StreamState(stream_key=str(r[0]), binding_id=str(r[1]), resource=str(r[2]),
                               cursor=cursor, runs=int(r[6]),
                               last_run_at_us=None if r[7] is None else int(r[7]),
                               row_version=int(r[8])))
    return out
