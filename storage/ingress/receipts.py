"""IngressReceipts and NormalizedEvents: the webhook ingress capability's SQL.

Theory of operation
-------------------
* ``ingress_receipts_insert``: plain INSERTs (one multi-row INSERT for a batch of
  concurrent deliveries: group commit). The unique ``dedup_key`` judges a duplicate (a
  redelivery, a spooled copy forwarded again, another replica's copy): ``DuplicateKey`` ->
  the delivery is counted on the existing row and nothing else is written. Whether a
  receipt went through the spool changes nothing about its identity.
* ``ingress_settle`` (``ingress_materialize`` for one): one transaction settles receipts:
  the conditional UPDATE
  ``received -> materialized`` judged by matched rows (a second materializer, on this
  replica or another, matches nothing and writes nothing), the receipt's immutable
  NormalizedEvents (ids ``<receipt>:<index>``), and their WorkItems through
  :func:`storage.work_admin.insert_work` (dedupe keys by event id). A crash anywhere before
  COMMIT leaves the receipt ``received``: it is simply materialized again.
  An event with an ``identity_key`` (its route declares a per-event identity) that an
  earlier receipt already holds, or that an earlier event of the same settlement holds,
  is not written again, nor is its WorkItem: it is counted on its receipt
  (``duplicate_events``). The unique index on ``identity_key`` is the judge; two
  materializers settling overlapping receipts at once meet there, and the loser's
  transaction fails (``DuplicateKey``) and is simply tried again, when the read finds the
  winner's events.
* ``ingress_quarantine``: ``received -> quarantined`` with a stable reason; the receipt
  and its raw body stay, and nothing retries it.

Rows become values only here (:func:`receipt_from_row`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

import attrs

from daemon.core.work import WorkSpec
from storage.bounded import BoundedCount, bounded_count
from storage.port import CommitOutcomeUnknown, Database, DuplicateKey, Row, SqlTx, StorageError
from storage.work_admin import insert_work
from storage.work_rows import placeholders

RECEIVED = "received"
MATERIALIZED = "materialized"
QUARANTINED = "quarantined"
STATES = (RECEIVED, MATERIALIZED, QUARANTINED)

# The verification of a delivery that matched the route's newest secret.
NEWEST_VERIFICATION = "verified:0"

_COLUMNS = (
    "receipt_id, dedup_key, route, binding_id, webhook, subscription_generation,"
    " received_at_us, body_b64, body_sha256, body_bytes, headers_json, verification, via,"
    " replica_id, duplicates, state, quarantine_reason, quarantine_detail, settled_at_us,"
    " row_version, duplicate_events"
)
_EVENT_COLUMNS = (
    "event_id, receipt_id, event_index, provider, binding_id, event_name, kind,"
    " resource_type, resource_id, delivered_at, remote_updated_at, subscription_generation,"
    " attributes_json, work_id, created_at_us, identity_key"
)


class _Contended(Exception):
    """Another materializer settled one of a batch's receipts first (rolls the batch back)."""


@attrs.frozen(kw_only=True)
class IngressReceipt:
    """One verified delivery, as ingress made it durable."""

    receipt_id: str
    dedup_key: str
    route: str
    binding_id: str
    webhook: str
    subscription_generation: int
    received_at_us: int
    body: bytes = attrs.field(repr=False)
    body_sha256: str
    headers: dict[str, str] = attrs.field(factory=dict)
    verification: str = "verified:0"
    via: str = "direct"
    replica_id: str = ""
    duplicates: int = 0
    state: str = RECEIVED
    quarantine_reason: str | None = None
    quarantine_detail: str | None = None
    settled_at_us: int | None = None
    # Events of this receipt another receipt (or this one, earlier) already held.
    duplicate_events: int = 0


@attrs.frozen(kw_only=True)
class NormalizedEvent:
    """One event of one receipt (immutable once written)."""

    event_id: str
    receipt_id: str
    event_index: int
    provider: str
    binding_id: str
    event_name: str
    kind: str
    resource_type: str
    resource_id: str
    delivered_at: str
    remote_updated_at: str | None
    subscription_generation: int
    attributes: dict[str, Any]
    work_id: str = ""
    created_at_us: int = 0
    # Unique per route, subscription generation and per-event identity (L1
    # event_identity, daemon.core.ingress.event_key); None: the route declares none.
    identity_key: str | None = None


@attrs.frozen
class ReceiptInsert:
    stored: bool          # False: a duplicate of receipt_id
    receipt_id: str


@attrs.frozen(kw_only=True)
class Materialization:
    receipt_id: str
    events: tuple[NormalizedEvent, ...]
    work: tuple[WorkSpec, ...]   # one per event, same order


@attrs.frozen
class Settled:
    """How one settlement went: ``won`` its receipt's state CAS (False: settled elsewhere,
    nothing written); ``duplicate_events``: its events that were already there."""

    won: bool
    duplicate_events: int = 0


@attrs.frozen(kw_only=True)
class QuarantineParams:
    receipt_id: str
    reason: str
    detail: str


@attrs.frozen(kw_only=True)
class ReceiptQuery:
    state: str | None = None
    route: str | None = None
    before_id: str | None = None    # keyset: receipts older than this id
    limit: int = 50


# The Ingress page's totals at size (issue 23: 500,000 receipts, 3.1 s a view when every
# receipt was counted). A state's count stops at COUNT_CAP ("more than" past it: a
# backlog that large is acted on as a whole, not counted to the last one); duplicates and
# the quarantine reasons are read from the newest SAMPLE receipts (their rows, not an
# index), exact while there are no more than that.
COUNT_CAP = 10_000
SAMPLE = 1_000


@attrs.frozen
class IngressCounts:
    by_state: dict[str, int]         # each at most COUNT_CAP; ``more`` names those past it
    oldest_received_us: int | None   # the oldest receipt still waiting to be materialized
    duplicates: int                  # redeliveries of the newest SAMPLE receipts
    # Quarantined receipts per stable reason, among the newest SAMPLE quarantined.
    quarantined_by_reason: dict[str, int] = attrs.field(factory=dict)
    more: frozenset[str] = frozenset()   # states with more than COUNT_CAP receipts
    counted_up_to: int = COUNT_CAP
    sample: int = SAMPLE

    def count(self, state: str) -> BoundedCount:
        return BoundedCount(self.by_state.get(state, 0), state in self.more)

    @property
    def sampled(self) -> bool:
        """Whether duplicates are of the newest ``sample`` receipts only (more exist)."""
        return bool(self.more) or sum(self.by_state.values()) > self.sample

    @property
    def reasons_sampled(self) -> bool:
        return QUARANTINED in self.more or self.by_state.get(QUARANTINED, 0) > self.sample


def receipt_from_row(row: Row) -> IngressReceipt:
    return IngressReceipt(
        receipt_id=str(row[0]), dedup_key=str(row[1]), route=str(row[2]),
        binding_id=str(row[3]), webhook=str(row[4]), subscription_generation=int(row[5]),
        received_at_us=int(row[6]), body=base64.b64decode(str(row[7])),
        body_sha256=str(row[8]), headers=json.loads(str(row[10])),
        verification=str(row[11]), via=str(row[12]), replica_id=str(row[13]),
        duplicates=int(row[14]), state=str(row[15]),
        quarantine_reason=None if row[16] is None else str(row[16]),
        quarantine_detail=None if row[17] is None else str(row[17]),
        settled_at_us=None if row[18] is None else int(row[18]),
        duplicate_events=int(row[20]),
    )


def event_from_row(row: Row) -> NormalizedEvent:
    return NormalizedEvent(
        event_id=str(row[0]), receipt_id=str(row[1]), event_index=int(row[2]),
        provider=str(row[3]), binding_id=str(row[4]), event_name=str(row[5]),
        kind=str(row[6]), resource_type=str(row[7]), resource_id=str(row[8]),
        delivered_at=str(row[9]),
        remote_updated_at=None if row[10] is None else str(row[10]),
        subscription_generation=int(row[11]), attributes=json.loads(str(row[12])),
        work_id=str(row[13]), created_at_us=int(row[14]),
        identity_key=None if row[15] is None else str(row[15]),
    )


def _receipt_params(r: IngressReceipt) -> tuple[Any, ...]:
    return (
        r.receipt_id, r.dedup_key, r.route, r.binding_id, r.webhook,
        r.subscription_generation, r.received_at_us, base64.b64encode(r.body).decode(),
        r.body_sha256, len(r.body), json.dumps(r.headers, sort_keys=True), r.verification,
        r.via, r.replica_id, 0, RECEIVED, None, None, None, 1, 0,
        r.received_at_us if r.verification != NEWEST_VERIFICATION else None,
    )


class IngressReceipts:
    """Mixed into ``WorkStore``."""

    db: Database

    async def ingress_receipt_insert(self, receipt: IngressReceipt,
                                     now_us: int) -> ReceiptInsert:
        """Make ``receipt`` durable, or count it as a duplicate of the row holding its key."""
        (answer,) = await self.ingress_receipts_insert([receipt], now_us)
        if isinstance(answer, StorageError):
            raise answer
        return answer

    async def ingress_receipts_insert(self, receipts: Sequence[IngressReceipt], now_us: int
                                      ) -> list[ReceiptInsert | StorageError]:
        """Make many receipts durable in one transaction (group commit under load): one
        multi-row INSERT; when a key is already there (or twice in the batch), one row at a
        time, each duplicate counted on the row holding its key (the same receipt again, a
        spooled copy forwarded twice, is not a duplicate delivery).

        A COMMIT of unknown outcome is settled by reading each key back (never a blind
        retry): the row is there (ours or an earlier copy's) or the batch is tried again."""
        async def body(tx: SqlTx) -> list[ReceiptInsert]:
            sql = (f"INSERT INTO ingress_receipts ({_COLUMNS}, previous_secret_at_us)"
                   f" VALUES ({', '.join('?' * 22)})")
            try:
                await tx.executemany(sql, [_receipt_params(r) for r in receipts])
                return [ReceiptInsert(True, r.receipt_id) for r in receipts]
            except DuplicateKey:
                pass
            out: list[ReceiptInsert] = []
            for r in receipts:
                try:
                    await tx.execute(sql, _receipt_params(r))
                    out.append(ReceiptInsert(True, r.receipt_id))
                    continue
                except DuplicateKey:
                    pass
                # A copy verified with a newer secret (a lower index: during a rotation the
                # old and the new subscription deliver the same event) is kept on the row:
                # its verification is the newest secret any copy was verified with, which
                # is how the subscription reconciler sees the provider use a new secret.
                # A copy verified with an older secret moves previous_secret_at_us: the
                # provider still signs with it (a retirement waits for a quiet window).
                old_at = r.received_at_us if r.verification != NEWEST_VERIFICATION else None
                await tx.execute("UPDATE ingress_receipts SET duplicates = duplicates + 1,"
                                 " verification = CASE WHEN verification > ? THEN ?"
                                 " ELSE verification END,"
                                 " previous_secret_at_us = CASE WHEN ? IS NULL THEN"
                                 " previous_secret_at_us WHEN previous_secret_at_us IS NULL"
                                 " OR previous_secret_at_us < ? THEN ? ELSE"
                                 " previous_secret_at_us END,"
                                 " row_version = row_version + 1 WHERE dedup_key = ?"
                                 " AND receipt_id <> ?",
                                 (r.verification, r.verification, old_at, old_at, old_at,
                                  r.dedup_key, r.receipt_id))
                rows = await tx.fetchall(
                    "SELECT receipt_id FROM ingress_receipts WHERE dedup_key = ?",
                    (r.dedup_key,))
                existing = str(rows[0][0])
                out.append(ReceiptInsert(existing == r.receipt_id, existing))
            return out

        for _ in range(3):
            try:
                return list(await self.db.transact(body, name="ingress.receipt"))
            except CommitOutcomeUnknown:
                settled: list[ReceiptInsert | StorageError] = []
                for r in receipts:
                    existing = await self._receipt_id_by_key(r.dedup_key)
                    if existing is None:
                        break
                    settled.append(ReceiptInsert(existing == r.receipt_id, existing))
                else:
                    return settled
        raise CommitOutcomeUnknown(f"{len(receipts)} ingress receipts: could not settle")

    async def _receipt_id_by_key(self, dedup_key: str) -> str | None:
        async def body(tx: SqlTx) -> str | None:
            rows = await tx.fetchall(
                "SELECT receipt_id FROM ingress_receipts WHERE dedup_key = ?", (dedup_key,))
            return str(rows[0][0]) if rows else None

        return await self.db.transact(body, name="ingress.by_key", write=False)

    async def ingress_receipts_pending(self, limit: int, routes: Sequence[str] | None = None
                                       ) -> list[IngressReceipt]:
        """Receipts still to be materialized, oldest first; with ``routes``, only theirs (a
        receipt of a route no longer configured waits, visible, without blocking others)."""
        where = "state = ?"
        args: list[Any] = [RECEIVED]
        if routes is not None:
            if not routes:
                return []
            where += f" AND route IN ({', '.join('?' * len(routes))})"
            args.extend(routes)

        async def body(tx: SqlTx) -> list[IngressReceipt]:
            rows = await tx.fetchall(
                f"SELECT {_COLUMNS} FROM ingress_receipts WHERE {where}"
                " ORDER BY received_at_us, receipt_id LIMIT ?", (*args, limit))
            return [receipt_from_row(r) for r in rows]

        return await self.db.transact(body, name="ingress.pending", write=False)

    async def ingress_materialize(self, params: Materialization, now_us: int) -> bool:
        """Settle one receipt with its events and their WorkItems (one transaction).
        False: it was already settled (by another materializer); nothing written."""
        (done,) = await self.ingress_settle([params], now_us)
        return done

    async def ingress_quarantine(self, params: QuarantineParams, now_us: int) -> bool:
        (done,) = await self.ingress_settle([params], now_us)
        return done

    async def ingress_settle(self, settlements: Sequence[Materialization | QuarantineParams],
                             now_us: int) -> list[bool]:
        """Settle many receipts in one transaction: each one's state CAS (judged by matched
        rows: one settled elsewhere writes nothing), then every materialized one's events
        and WorkItems. One True/False per settlement, in order."""
        return [s.won for s in await self.ingress_settle_counted(settlements, now_us)]

    async def ingress_settle_counted(
            self, settlements: Sequence[Materialization | QuarantineParams], now_us: int
    ) -> list[Settled]:
        """:meth:`ingress_settle`, with each materialization's count of events that were
        already there (by identity key: written by an earlier receipt, or twice in one)."""
        for s in settlements:
            if isinstance(s, Materialization) and len(s.events) != len(s.work):
                raise ValueError("one WorkSpec per event")
        duplicates: dict[str, int] = {}

        async def new_events(tx: SqlTx, plans: list[Materialization]
                             ) -> list[tuple[NormalizedEvent, WorkSpec]]:
            """The plans' events (with their WorkSpecs) whose identity key no stored event
            and no earlier event of these plans holds; the others counted per receipt."""
            keys = sorted({e.identity_key for p in plans for e in p.events
                           if e.identity_key is not None})
            seen: set[str] = set()
            for start in range(0, len(keys), 500):
                chunk = keys[start:start + 500]
                rows = await tx.fetchall(
                    "SELECT identity_key FROM normalized_events WHERE identity_key IN"
                    f" ({placeholders(len(chunk))})", tuple(chunk))
                seen.update(str(r[0]) for r in rows)
            out: list[tuple[NormalizedEvent, WorkSpec]] = []
            for p in plans:
                for event, work in zip(p.events, p.work, strict=True):
                    if event.identity_key is None:
                        out.append((event, work))
                    elif event.identity_key in seen:
                        duplicates[p.receipt_id] = duplicates.get(p.receipt_id, 0) + 1
                    else:
                        seen.add(event.identity_key)
                        out.append((event, work))
            return out

        async def write(tx: SqlTx, plans: list[Materialization]) -> None:
            duplicates.clear()  # a transaction tried again counts afresh
            fresh = await new_events(tx, plans)
            counted = sorted(duplicates.items())
            if counted:
                await tx.executemany(
                    "UPDATE ingress_receipts SET duplicate_events = ? WHERE receipt_id = ?",
                    [(n, receipt_id) for receipt_id, n in counted])
            if not fresh:
                return
            # Fresh keys: a WorkItem's dedupe key derives from an event id, and only the
            # winner of its receipt's state CAS (this transaction) writes those.
            results = await insert_work(tx, [w for _, w in fresh], now_us,
                                        fresh_dedupe_keys=True)
            await tx.executemany(
                f"INSERT INTO normalized_events ({_EVENT_COLUMNS}) VALUES"
                f" ({', '.join('?' * 16)})",
                [(e.event_id, e.receipt_id, e.event_index, e.provider, e.binding_id,
                  e.event_name, e.kind, e.resource_type, e.resource_id, e.delivered_at,
                  e.remote_updated_at, e.subscription_generation,
                  json.dumps(e.attributes, sort_keys=True), res.work_id, now_us,
                  e.identity_key)
                 for (e, _), res in zip(fresh, results, strict=True)])

        async def quarantine(tx: SqlTx, q: QuarantineParams) -> bool:
            matched = await tx.execute(
                "UPDATE ingress_receipts SET state = ?, quarantine_reason = ?,"
                " quarantine_detail = ?, settled_at_us = ?, row_version = row_version + 1"
                " WHERE receipt_id = ? AND state = ?",
                (QUARANTINED, q.reason, q.detail[:500], now_us, q.receipt_id, RECEIVED))
            return matched == 1

        materialize = [s for s in settlements if isinstance(s, Materialization)]

        async def bulk(tx: SqlTx) -> list[bool]:
            """The usual case: nobody else settled any of them. One UPDATE for every
            materialization, judged by matched rows; fewer matched -> row by row."""
            if materialize:
                ids = [m.receipt_id for m in materialize]
                matched = await tx.execute(
                    "UPDATE ingress_receipts SET state = ?, settled_at_us = ?,"
                    " row_version = row_version + 1 WHERE state = ? AND receipt_id IN"
                    f" ({', '.join('?' * len(ids))})", (MATERIALIZED, now_us, RECEIVED, *ids))
                if matched != len(set(ids)):
                    raise _Contended()
            won = [True if isinstance(s, Materialization) else await quarantine(tx, s)
                   for s in settlements]
            await write(tx, materialize)
            return won

        async def one_by_one(tx: SqlTx) -> list[bool]:
            won: list[bool] = []
            plans: list[Materialization] = []
            for s in settlements:
                if isinstance(s, Materialization):
                    matched = await tx.execute(
                        "UPDATE ingress_receipts SET state = ?, settled_at_us = ?,"
                        " row_version = row_version + 1 WHERE receipt_id = ? AND state = ?",
                        (MATERIALIZED, now_us, s.receipt_id, RECEIVED))
                    if matched == 1:
                        plans.append(s)
                    won.append(matched == 1)
                else:
                    won.append(await quarantine(tx, s))
            await write(tx, plans)
            return won

        def counted(won: list[bool]) -> list[Settled]:
            return [Settled(w, duplicates.get(s.receipt_id, 0) if w else 0)
                    for s, w in zip(settlements, won, strict=True)]

        for _ in range(2):
            try:
                if len({m.receipt_id for m in materialize}) == len(materialize):
                    try:
                        return counted(await self.db.transact(bulk, name="ingress.settle"))
                    except _Contended:
                        pass
                return counted(await self.db.transact(one_by_one, name="ingress.settle"))
            except DuplicateKey:
                # Another materializer committed an event of ours (overlapping receipts)
                # after our read: rolled back, tried again, the read now finds it.
                continue
        return counted(await self.db.transact(one_by_one, name="ingress.settle"))

    async def ingress_receipt_get(self, receipt_id: str) -> IngressReceipt | None:
        async def body(tx: SqlTx) -> IngressReceipt | None:
            rows = await tx.fetchall(
                f"SELECT {_COLUMNS} FROM ingress_receipts WHERE receipt_id = ?", (receipt_id,))
            return receipt_from_row(rows[0]) if rows else None

        return await self.db.transact(body, name="ingress.get", write=False)

    async def ingress_receipt_list(self, query: ReceiptQuery) -> list[IngressReceipt]:
        """Newest first, keyset pages."""
        where: list[str] = []
        args: list[Any] = []
        if query.state is not None:
            where.append("state = ?")
            args.append(query.state)
        if query.route is not None:
            where.append("route = ?")
            args.append(query.route)
        if query.before_id is not None:
            where.append("receipt_id < ?")
            args.append(query.before_id)
        sql = (f"SELECT {_COLUMNS} FROM ingress_receipts"
               f"{' WHERE ' + ' AND '.join(where) if where else ''}"
               " ORDER BY receipt_id DESC LIMIT ?")

        async def body(tx: SqlTx) -> list[IngressReceipt]:
            rows = await tx.fetchall(sql, (*args, max(1, min(query.limit, 500))))
            return [receipt_from_row(r) for r in rows]

        return await self.db.transact(body, name="ingress.list", write=False)

    async def ingress_events_of(self, receipt_id: str) -> list[NormalizedEvent]:
        async def body(tx: SqlTx) -> list[NormalizedEvent]:
            rows = await tx.fetchall(
                f"SELECT {_EVENT_COLUMNS} FROM normalized_events WHERE receipt_id = ?"
                " ORDER BY event_index", (receipt_id,))
            return [event_from_row(r) for r in rows]

        return await self.db.transact(body, name="ingress.events", write=False)

    async def ingress_counts(self, cap: int | None = None, sample: int | None = None
                             ) -> IngressCounts:
        """Totals per state (bounded: each reads at most COUNT_CAP + 1 entries of the
        (state, receipt_id) index), the oldest waiting (the (state, received_at_us)
        index's first entry), and duplicates and reasons of the newest SAMPLE receipts."""

        bound = COUNT_CAP if cap is None else cap
        newest = SAMPLE if sample is None else sample

        async def body(tx: SqlTx) -> IngressCounts:
            counts = {s: await bounded_count(
                tx, "SELECT 1 FROM ingress_receipts WHERE state = ?", (s,), bound)
                for s in STATES}
            dups = await tx.fetchall(
                "SELECT SUM(duplicates) FROM (SELECT duplicates FROM ingress_receipts"
                " ORDER BY receipt_id DESC LIMIT ?) newest", (newest,))
            rows = await tx.fetchall(
                "SELECT MIN(received_at_us) FROM ingress_receipts WHERE state = ?",
                (RECEIVED,))
            oldest = rows[0][0] if rows else None
            reasons = {str(reason): int(count) for reason, count in await tx.fetchall(
                "SELECT quarantine_reason, COUNT(*) FROM (SELECT quarantine_reason"
                " FROM ingress_receipts WHERE state = ? ORDER BY receipt_id DESC LIMIT ?)"
                " newest GROUP BY quarantine_reason", (QUARANTINED, newest))}
            return IngressCounts(
                {s: c.n for s, c in counts.items()}, None if oldest is None else int(oldest),
                int(dups[0][0] or 0), reasons,
                more=frozenset(s for s, c in counts.items() if c.more),
                counted_up_to=bound, sample=newest)

        return await self.db.transact(body, name="ingress.counts", write=False)
