"""The legacy claimant's storage: events, its claim loop's statements, its probe.

Theory of operation
-------------------
An event is ``pending`` until a worker claims it (``processing`` under a lease),
then ``succeeded`` or ``dead``. Each event names the dedupe key its WorkItem has
(``work_key``), which is how the two owners agree on one logical item.

The claim statement admits a row only while (a) the family's owner-generation
row names the legacy owner (or there is none: the family never moved) and (b)
the event has no WorkItem, or its WorkItem is fenced for the legacy owner
(``awaiting_legacy_outcome``): work integrationd executed or reconciled is never
run again here.

integrationd sees this owner as it sees any legacy claimant: through the SQL
adapter its configuration declares (:data:`CLAIMANT_SQL`, the
``[[legacy_claimants]]`` entry of ``config/example.toml``); nothing under
``daemon/`` or ``storage/`` knows this module.
"""

from __future__ import annotations

import hashlib
import secrets

import attrs

from config.settings import LegacyClaimantSettings
from daemon.core.work import WorkSpec
from storage.cutover.legacy import LegacyOutcomeReceipt, legacy_receipt_write
from storage.dialect import Dialect
from storage.port import SqlTx
from storage.work_store import WorkStore

DDL = """
CREATE TABLE legacy_events (
    event_id {KEY}(64) NOT NULL PRIMARY KEY,
    family {KEY}(64) NOT NULL,
    work_key {KEY}(255) NOT NULL,
    payload {TEXT} NOT NULL,
    state {KEY}(32) NOT NULL,
    claimed_by {KEY}(128) NULL,
    lease_until_us BIGINT NULL,
    attempts INTEGER NOT NULL,
    outcome {KEY}(32) NULL,
    evidence {TEXT} NULL,
    probe_version BIGINT NOT NULL,
    created_at_us BIGINT NOT NULL,
    finished_at_us BIGINT NULL
) {OPTS};
CREATE UNIQUE INDEX legacy_events_work_key ON legacy_events (work_key);
CREATE INDEX legacy_events_ready ON legacy_events (family, state, event_id);
"""

# The legacy owner may claim the family now (read in the claim statement itself).
_ADMITTED = (
    " AND NOT EXISTS (SELECT 1 FROM owner_generations g"
    " WHERE g.family = legacy_events.family AND g.claimant <> 'legacy')"
    " AND NOT EXISTS (SELECT 1 FROM work_items w WHERE w.dedupe_key = legacy_events.work_key"
    " AND w.state <> 'awaiting_legacy_outcome')"
)


def work_key(event_id: str) -> str:
    return f"legacy:{event_id}"


@attrs.frozen
class LegacyEvent:
    event_id: str
    family: str
    work_key: str
    payload: str
    state: str
    attempts: int
    outcome: str | None
    evidence: str | None = None


async def install(store: WorkStore) -> None:
    """Create the legacy owner's own table (idempotent)."""
    dialect: Dialect = store.dialect

    async def body(tx: SqlTx) -> None:
        if await tx.fetchall(dialect.table_exists_sql, ("legacy_events",)):
            return
        for stmt in dialect.render_ddl(DDL):
            await tx.execute(stmt)

    await store.db.transact(body, name="legacy.install")


async def add_events(store: WorkStore, family: str, payloads: list[str], now_us: int
                     ) -> list[str]:
    ids = [f"ev-{secrets.token_hex(8)}" for _ in payloads]

    async def body(tx: SqlTx) -> None:
        for event_id, payload in zip(ids, payloads, strict=True):
            await tx.execute(
                "INSERT INTO legacy_events (event_id, family, work_key, payload, state,"
                " claimed_by, lease_until_us, attempts, outcome, evidence, probe_version,"
                " created_at_us, finished_at_us)"
                " VALUES (?, ?, ?, ?, 'pending', NULL, NULL, 0, NULL, NULL, 0, ?, NULL)",
                (event_id, family, work_key(event_id), payload, now_us))

    await store.db.transact(body, name="legacy.add")
    return ids


async def claim_one(store: WorkStore, family: str, worker: str, lease_us: int,
                    now_us: int) -> LegacyEvent | None:
    """The legacy claim loop's one step: select a candidate, conditional UPDATE."""

    async def body(tx: SqlTx) -> LegacyEvent | None:
        # Candidates are eligible events only: pending events whose WorkItem
        # integrationd ran stay pending here for ever, and a window over every
        # pending event would stall behind them (the conditional UPDATE still
        # decides, so a candidate that stopped being eligible is skipped).
        rows = await tx.fetchall(
            "SELECT event_id FROM legacy_events WHERE family = ? AND state = 'pending'"
            + _ADMITTED + " ORDER BY event_id LIMIT 4", (family,))
        for (event_id,) in rows:
            if await tx.execute(
                "UPDATE legacy_events SET state = 'processing', claimed_by = ?,"
                " lease_until_us = ?, attempts = attempts + 1"
                " WHERE event_id = ? AND state = 'pending'" + _ADMITTED,
                (worker, now_us + lease_us, event_id)):
                found = await tx.fetchall(
                    "SELECT event_id, family, work_key, payload, state, attempts, outcome"
                    " FROM legacy_events WHERE event_id = ?", (event_id,))
                r = found[0]
                return LegacyEvent(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]),
                                   int(r[5]), None)
        return None

    return await store.db.transact(body, name="legacy.claim")


def receipt_digest(event_id: str, outcome: str) -> str:
    return "sha256:" + hashlib.sha256(f"{event_id}\n{outcome}".encode()).hexdigest()


async def finish(store: WorkStore, event: LegacyEvent, worker: str, outcome: str,
                 now_us: int, evidence: str | None = None) -> bool:
    """Terminal transition, with the legacy outcome receipt in the same transaction
    when the event's WorkItem is fenced for this owner. False: not ours any more."""

    async def body(tx: SqlTx) -> bool:
        if not await tx.execute(
            "UPDATE legacy_events SET state = ?, outcome = ?, evidence = ?, finished_at_us = ?,"
            " lease_until_us = NULL WHERE event_id = ? AND state = 'processing'"
            " AND claimed_by = ?",
            ("succeeded" if outcome == "succeeded" else "dead", outcome, evidence, now_us,
             event.event_id, worker)):
            return False
        fenced = await tx.fetchall(
            "SELECT work_id, rollback_execution_fence_id FROM work_items"
            " WHERE dedupe_key = ? AND state = 'awaiting_legacy_outcome'", (event.work_key,))
        for work_id, fence_id in fenced:
            await legacy_receipt_write(tx, LegacyOutcomeReceipt(
                work_id=str(work_id), fence_id=str(fence_id), version=1,
                digest=receipt_digest(event.event_id, outcome), outcome=outcome), now_us)
        return True

    return await store.db.transact(body, name="legacy.finish")


async def events(store: WorkStore, family: str) -> list[LegacyEvent]:
    async def body(tx: SqlTx) -> list[LegacyEvent]:
        rows = await tx.fetchall(
            "SELECT event_id, family, work_key, payload, state, attempts, outcome, evidence"
            " FROM legacy_events WHERE family = ? ORDER BY event_id", (family,))
        return [LegacyEvent(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]), int(r[5]),
                            str(r[6]) if r[6] is not None else None,
                            str(r[7]) if r[7] is not None else None) for r in rows]

    return await store.db.transact(body, name="legacy.events", write=False)


async def materialize(store: WorkStore, family: str, org_id: str, now_us: int) -> int:
    """One WorkItem per eligible (pending) event that has none; idempotent by the
    event's dedupe key. An event whose WorkItem exists -- even a reconciled
    terminal one -- gets no second WorkItem. Returns how many were created."""

    async def body(tx: SqlTx) -> list[tuple[str, str]]:
        rows = await tx.fetchall(
            "SELECT e.event_id, e.payload FROM legacy_events e WHERE e.family = ?"
            " AND e.state = 'pending' AND NOT EXISTS (SELECT 1 FROM work_items w"
            " WHERE w.dedupe_key = e.work_key) ORDER BY e.event_id", (family,))
        return [(str(r[0]), str(r[1])) for r in rows]

    missing = await store.db.transact(body, name="legacy.uncovered", write=False)
    results = await store.work_enqueue([
        WorkSpec(family=family, org_id=org_id, subject_kind="legacy_event",
                 subject_id=event_id, payload=payload, dedupe_key=work_key(event_id))
        for event_id, payload in missing], now_us)
    return sum(1 for r in results if r.created)


# The cutover sees this owner through the configured SQL adapter like any other
# legacy claimant (docs/operations.md, "Your legacy claimant"): these statements are
# the [[legacy_claimants]] entry of config/example.toml. The lock touches every live
# event (row-locking them, waiting for any a claim holds), then the counts follow in
# the step's transaction, so a legacy claim cannot commit unseen between the count
# and the receipt.
CLAIMANT_SQL = {
    "lock_sql": "UPDATE legacy_events SET probe_version = probe_version + 1"
                " WHERE family = :family AND state IN ('pending', 'processing')",
    "processing_sql": "SELECT COUNT(*) FROM legacy_events WHERE family = :family"
                      " AND state = 'processing'",
    "uncovered_sql": "SELECT COUNT(*) FROM legacy_events e WHERE e.family = :family"
                     " AND e.state = 'pending' AND NOT EXISTS (SELECT 1 FROM work_items w"
                     " WHERE w.dedupe_key = e.work_key)",
}


def claimant_settings(family: str) -> LegacyClaimantSettings:
    """This owner's ``[[legacy_claimants]]`` entry for ``family``."""
    return LegacyClaimantSettings(family=family, adapter="sql", **CLAIMANT_SQL)
