"""Observed RemoteSubscription rows (migration ``remote_subscriptions``), moved by
compare-and-swap on ``row_version`` in the caller's (fenced) transaction.

The cleanup tokens arrive here already sealed (``Sealed``: key id, nonce and ciphertext);
this module never sees one in the clear.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import attrs

from storage.port import DuplicateKey, SqlTx, WorkConflict

_COLUMNS = ("name, binding_id, route, resource, action, url, payload_version, provider_id,"
            " generation, secret_generation, health, cleanup_key_id, cleanup_token, retiring,"
            " rotating, rotated_at_us, last_reconciled_at_us, last_outcome, last_reason,"
            " row_version, updated_at_us")


@attrs.frozen
class Sealed:
    """A sealed cleanup token: the token key's id and ``nonce + ciphertext``."""

    key_id: str
    blob: bytes = attrs.field(repr=False)

    def text(self) -> str:
        return base64.b64encode(self.blob).decode()

    @classmethod
    def from_text(cls, key_id: str, text: str) -> Sealed:
        return cls(key_id, base64.b64decode(text))


@attrs.frozen(kw_only=True)
class Retiring:
    provider_id: str
    generation: int
    cleanup: Sealed | None = None


@attrs.frozen(kw_only=True)
class SubscriptionRow:
    name: str
    binding_id: str
    route: str
    resource: str
    action: str
    url: str
    payload_version: int
    provider_id: str
    generation: int
    secret_generation: int
    health: str = "active"  # active | disabled | missing
    cleanup: Sealed | None = None
    retiring: tuple[Retiring, ...] = ()
    rotating: bool = False
    rotated_at_us: int | None = None
    last_reconciled_at_us: int | None = None
    last_outcome: str | None = None
    last_reason: str | None = None
    row_version: int = 0  # 0: no row yet
    updated_at_us: int = 0


def _retiring_text(items: Sequence[Retiring]) -> str:
    return json.dumps([{"provider_id": r.provider_id, "generation": r.generation,
                        "key_id": r.cleanup.key_id if r.cleanup else None,
                        "cleanup": r.cleanup.text() if r.cleanup else None} for r in items],
                      sort_keys=True, separators=(",", ":"))


def _retiring(text: str) -> tuple[Retiring, ...]:
    return tuple(Retiring(provider_id=str(d["provider_id"]), generation=int(d["generation"]),
                          cleanup=None if d.get("cleanup") is None
                          else Sealed.from_text(str(d["key_id"]), str(d["cleanup"])))
                 for d in json.loads(text))


def _from_row(r: Sequence[object]) -> SubscriptionRow:
    return SubscriptionRow(
        name=str(r[0]), binding_id=str(r[1]), route=str(r[2]), resource=str(r[3]),
        action=str(r[4]), url=str(r[5]), payload_version=int(str(r[6])),
        provider_id=str(r[7]), generation=int(str(r[8])), secret_generation=int(str(r[9])),
        health=str(r[10]),
        cleanup=None if r[12] is None else Sealed.from_text(str(r[11]), str(r[12])),
        retiring=_retiring(str(r[13])), rotating=bool(int(str(r[14]))),
        rotated_at_us=None if r[15] is None else int(str(r[15])),
        last_reconciled_at_us=None if r[16] is None else int(str(r[16])),
        last_outcome=None if r[17] is None else str(r[17]),
        last_reason=None if r[18] is None else str(r[18]),
        row_version=int(str(r[19])), updated_at_us=int(str(r[20])))


async def read_subscriptions(tx: SqlTx, binding_id: str | None = None
                             ) -> list[SubscriptionRow]:
    """One binding's rows (every row when ``binding_id`` is None), by name."""
    if binding_id is None:
        rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM remote_subscriptions ORDER BY name",
                                 ())
    else:
        rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM remote_subscriptions"
                                 " WHERE binding_id = ? ORDER BY name", (binding_id,))
    return [_from_row(r) for r in rows]


async def read_subscription(tx: SqlTx, name: str) -> SubscriptionRow | None:
    rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM remote_subscriptions WHERE name = ?",
                             (name,))
    return _from_row(rows[0]) if rows else None


def _params(row: SubscriptionRow) -> tuple[object, ...]:
    return (row.binding_id, row.route, row.resource, row.action, row.url,
            row.payload_version, row.provider_id, row.generation, row.secret_generation,
            row.health, row.cleanup.key_id if row.cleanup else None,
            row.cleanup.text() if row.cleanup else None, _retiring_text(row.retiring),
            int(row.rotating), row.rotated_at_us, row.last_reconciled_at_us,
            row.last_outcome, row.last_reason)


async def write_subscription(tx: SqlTx, before: SubscriptionRow | None, after: SubscriptionRow,
                             now_us: int) -> SubscriptionRow:
    """Insert ``after`` (``before`` None) or move ``before`` (as read) to ``after``.
    A row that moved since it was read is a ``WorkConflict`` (nothing written)."""
    if before is None:
        try:
            await tx.execute(
                f"INSERT INTO remote_subscriptions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?,"
                " ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)",
                (after.name, *_params(after), now_us))
        except DuplicateKey:
            raise WorkConflict(f"subscription {after.name} appeared concurrently") from None
        return attrs.evolve(after, row_version=1, updated_at_us=now_us)
    if not await tx.execute(
        "UPDATE remote_subscriptions SET binding_id = ?, route = ?, resource = ?, action = ?,"
        " url = ?, payload_version = ?, provider_id = ?, generation = ?, secret_generation = ?,"
        " health = ?, cleanup_key_id = ?, cleanup_token = ?, retiring = ?, rotating = ?,"
        " rotated_at_us = ?, last_reconciled_at_us = ?, last_outcome = ?, last_reason = ?,"
        " row_version = row_version + 1, updated_at_us = ? WHERE name = ? AND row_version = ?",
        (*_params(after), now_us, before.name, before.row_version),
    ):
        raise WorkConflict(f"subscription {before.name} changed concurrently")
    return attrs.evolve(after, row_version=before.row_version + 1, updated_at_us=now_us)


async def delete_subscription(tx: SqlTx, before: SubscriptionRow) -> None:
    if not await tx.execute("DELETE FROM remote_subscriptions WHERE name = ? AND row_version = ?",
                            (before.name, before.row_version)):
        raise WorkConflict(f"subscription {before.name} changed concurrently")


async def newest_secret_seen(tx: SqlTx, route: str, since_us: int) -> bool:
    """Whether a delivery to ``route`` verified with its newest secret (index 0) was
    received at or after ``since_us``: the provider uses the rotated secret."""
    rows = await tx.fetchall(
        "SELECT receipt_id FROM ingress_receipts WHERE route = ? AND received_at_us >= ?"
        " AND verification = ? LIMIT 1", (route, since_us, "verified:0"))
    return bool(rows)


@attrs.frozen(kw_only=True)
class LastItem:
    """The newest WorkItem of a subject that has run (or been given back with a reason)."""

    work_id: str
    subject_kind: str
    state: str
    attempt: int
    failure_class: str | None
    summary: str | None
    updated_at_us: int


async def last_items(tx: SqlTx, family: str, subjects: Sequence[str]) -> dict[str, LastItem]:
    """Per subject id, its newest item of ``family`` that is not merely queued (a chain's
    next run waits ``pending`` with no summary: it is not a last run). Each read is one
    walk down ``work_items_subject`` (subject_id, work_id): ids are time-ordered."""
    out: dict[str, LastItem] = {}
    for subject in subjects:
        rows = await tx.fetchall(
            "SELECT work_id, subject_kind, state, attempt, failure_class, operator_summary,"
            " updated_at_us FROM work_items WHERE subject_id = ? AND family = ?"
            " AND (state <> 'pending' OR operator_summary IS NOT NULL)"
            " ORDER BY work_id DESC LIMIT 1", (subject, family))
        if rows:
            r = rows[0]
            out[subject] = LastItem(
                work_id=str(r[0]), subject_kind=str(r[1]), state=str(r[2]),
                attempt=int(str(r[3])), failure_class=None if r[4] is None else str(r[4]),
                summary=None if r[5] is None else str(r[5]), updated_at_us=int(str(r[6])))
    return out
