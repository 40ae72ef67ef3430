"""The inbound Flow's storage: per-record watermarks, and the fenced journal rows of its
Runtime mutations (``effect_attempts``, the same DoOnce journal as provider calls).

Every function takes the caller's transaction: the handler runs them inside
``WorkContext.fenced`` (or its finalization), so a stale claimant writes nothing.
A watermark row changes by compare-and-swap on ``row_version`` (judged by affected rows);
an absent row is inserted, and a concurrent insert is a ``WorkConflict`` (the lane
serializes changes of one record, so that is a bug or a replayed item racing its lane).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs

from daemon.core.canonical import canonical_bytes
from daemon.core.work import Fence
from storage.effect_values import AttemptDraft
from storage.effects import _INSERT_ATTEMPT_SQL, _attempt_params
from storage.idgen import new_ulid
from storage.port import DuplicateKey, SqlTx, WorkConflict

_COLUMNS = ("locator_hash, scope_digest, remote_object, remote_id, field_stamps,"
            " webhook_seen_ns, deleted_ns, row_version, updated_at_us")


@attrs.frozen(kw_only=True)
class Watermark:
    locator_hash: str
    scope_digest: str
    remote_object: str
    remote_id: str
    field_stamps: Mapping[str, int] = attrs.field(factory=dict)
    webhook_seen_ns: int = 0
    deleted_ns: int | None = None
    row_version: int = 0  # 0: no row yet


@attrs.frozen(kw_only=True)
class WatermarkAdvance:
    """What one applied (or observed) change moves forward; never backward."""

    stamps: Mapping[str, int] = attrs.field(factory=dict)
    webhook_seen_ns: int | None = None
    deleted_ns: int | None = None


async def read_watermark(tx: SqlTx, locator_hash: str, scope_digest: str, remote_object: str,
                         remote_id: str) -> Watermark:
    rows = await tx.fetchall(
        f"SELECT {_COLUMNS} FROM inbound_watermarks WHERE locator_hash = ?", (locator_hash,))
    if not rows:
        return Watermark(locator_hash=locator_hash, scope_digest=scope_digest,
                         remote_object=remote_object, remote_id=remote_id)
    r = rows[0]
    stamps = json.loads(str(r[4]))
    return Watermark(locator_hash=str(r[0]), scope_digest=str(r[1]), remote_object=str(r[2]),
                     remote_id=str(r[3]), field_stamps={str(k): int(v) for k, v in
                                                        stamps.items()},
                     webhook_seen_ns=int(r[5]),
                     deleted_ns=None if r[6] is None else int(r[6]), row_version=int(r[7]))


def _merged(before: Watermark, advance: WatermarkAdvance) -> tuple[dict[str, int], int,
                                                                    int | None]:
    stamps = dict(before.field_stamps)
    for name, value in advance.stamps.items():
        stamps[name] = max(stamps.get(name, value), value)
    seen = max(before.webhook_seen_ns, advance.webhook_seen_ns or 0)
    deleted = before.deleted_ns
    if advance.deleted_ns is not None:
        deleted = advance.deleted_ns if deleted is None else max(deleted, advance.deleted_ns)
    return stamps, seen, deleted


async def advance_watermark(tx: SqlTx, before: Watermark, advance: WatermarkAdvance,
                            now_us: int) -> None:
    """Move ``before`` (as read in this claim) forward by ``advance``."""
    stamps, seen, deleted = _merged(before, advance)
    text = canonical_bytes(stamps).decode()
    if before.row_version == 0:
        try:
            await tx.execute(
                f"INSERT INTO inbound_watermarks ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
                (before.locator_hash, before.scope_digest, before.remote_object,
                 before.remote_id, text, seen, deleted, now_us))
        except DuplicateKey:
            raise WorkConflict(f"inbound watermark {before.locator_hash} appeared"
                               " concurrently") from None
        return
    if not await tx.execute(
        "UPDATE inbound_watermarks SET field_stamps = ?, webhook_seen_ns = ?, deleted_ns = ?,"
        " row_version = row_version + 1, updated_at_us = ?"
        " WHERE locator_hash = ? AND row_version = ?",
        (text, seen, deleted, now_us, before.locator_hash, before.row_version),
    ):
        raise WorkConflict(f"inbound watermark {before.locator_hash} changed concurrently")


async def checkpoint_mutation(tx: SqlTx, fence: Fence, draft: AttemptDraft,
                              now_us: int) -> str:
    """The dispatch-start checkpoint of one Runtime mutation (commit before sending).

    ``draft.command_id`` is the WorkItem's id: an inbound mutation has no ExternalCommand
    (no Runtime intent asked for it); it is the WorkItem's own effect. One per claim
    (``effect_attempts_claim`` is unique on work id and epoch)."""
    attempt_id = new_ulid(now_us)
    # An earlier claim of this item that ended mid-dispatch (kill, lost lease) left its
    # attempt with no outcome. The mutation is replay-safe and about to be resent with
    # the same key: that attempt's outcome is the replay-safe retry, not unknown.
    await tx.execute(
        "UPDATE effect_attempts SET outcome = ?, evidence = ?, failure_class = ?,"
        " finished_at_us = ?, row_version = row_version + 1"
        " WHERE command_id = ? AND outcome IS NULL AND disposition IS NULL",
        ("REPLAY_SAFE_RETRY", "maybe_applied", "claim_ended", now_us, draft.command_id))
    await tx.execute(_INSERT_ATTEMPT_SQL, _attempt_params(attempt_id, fence, draft, now_us))
    return attempt_id
