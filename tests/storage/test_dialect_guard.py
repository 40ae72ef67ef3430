"""The dialect guard: every SQL statement the store emits stays inside the portable subset.

A recording wrapper sits between the store and the real adapter while a
workload drives every store method (migrations, enqueue with lanes and dedupe,
claims with expiry and lane conflicts, renewals, every finalization, cancel,
replay, depths, rollback states, Catalog revisions). Each recorded statement is checked against
the constructs TiDB, MariaDB and SQLite do not share (docs/architecture.md).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest

from daemon.core.grant_reasons import grant_reason
from daemon.core.outcomes import (
    CancelAcknowledged,
    DeadLetter,
    Deferred,
    Outcome,
    Released,
    RetryLater,
    Succeeded,
)
from daemon.core.principals import BindingEvent, BindingIdentity, PrincipalKind, connect
from daemon.core.quota import QuotaPolicy, ReservationState
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from storage.effect_values import AttemptDraft, Kin
from storage.effects import insert_attempt_pinned, subjects_in_doubt, unresolved_of_kin
from storage.grants import GrantState
from storage.history import ExecutionFilter
from storage.ingress.receipts import QuarantineParams, ReceiptQuery
from storage.migrate import migrate
from storage.port import (
    Database,
    DbStats,
    PublishParams,
    RenewGroup,
    ReplayParams,
    Row,
    SqlTx,
    WorkConflict,
    WorkQuery,
)
from storage.principals import Actor
from storage.quota import reservation_move, reservation_open
from storage.refresh_leases import refresh_lease_acquire
from storage.retention.prune import LeaseParams
from storage.subscriptions import last_items
from storage.work_rollback import LegacyReceipt
from storage.work_store import WorkStore
from tests.support.backends import fresh_database
from tests.support.ingress import materialization, receipt
from tests.support.retention import PAST_FACTS, PAST_WORK, prune
from tests.support.work import SEC, T0, claim, enqueue, finalize, spec

T = TypeVar("T")

BANNED = {
    "SKIP LOCKED": r"\bSKIP\s+LOCKED\b",
    "FOR UPDATE": r"\bFOR\s+UPDATE\b",
    "RETURNING": r"\bRETURNING\b",
    "UPDATE ... LIMIT": r"^\s*UPDATE\b(?:(?!\bSELECT\b).)*\bLIMIT\b",
    "ON DUPLICATE KEY": r"\bON\s+DUPLICATE\s+KEY\b",
    "ON CONFLICT": r"\bON\s+CONFLICT\b",
    "INSERT OR": r"\bINSERT\s+OR\b",
    "REPLACE INTO": r"\bREPLACE\s+INTO\b",
    "INSERT IGNORE": r"\bINSERT\s+IGNORE\b",
    "trigger/procedure/event": r"\bCREATE\s+(TRIGGER|PROCEDURE|FUNCTION|EVENT)\b",
    "foreign key": r"\b(FOREIGN\s+KEY|REFERENCES)\b",
    "CHECK constraint": r"\bCHECK\s*\(",
    "AUTO_INCREMENT": r"\bAUTO_?INCREMENT\b",
    "JSON predicate": r"\bJSON_\w+\s*\(|->>",
    "XA": r"^\s*XA\b",
    "LOCK TABLES": r"\bLOCK\s+TABLES?\b",
    "NOW()": r"\b(NOW|CURRENT_TIMESTAMP|UNIX_TIMESTAMP)\b",
    "multi-statement": r";\s*\S",
}


class RecordingTx:
    def __init__(self, inner: SqlTx, seen: set[str]) -> None:
        self._inner = inner
        self._seen = seen

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._seen.add(sql)
        return await self._inner.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        self._seen.add(sql)
        return await self._inner.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        self._seen.add(sql)
        return await self._inner.fetchall(sql, params)


class RecordingDatabase:
    def __init__(self, inner: Database) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.stats: DbStats = inner.stats
        self.max_statement_bytes = inner.max_statement_bytes
        self.seen: set[str] = set()

    async def transact(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str,
                       write: bool = True) -> T:
        return await self.inner.transact(lambda tx: body(RecordingTx(tx, self.seen)),
                                         name=name, write=write)

    async def ping(self) -> None:
        await self.inner.ping()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _workload(store: WorkStore) -> None:
    await migrate(store.db, store.dialect, T0)
    await enqueue(store, 3, source_lane="L", target_lane="T")
    await enqueue(store, 2, dedupe_key=None)
    await store.work_enqueue([spec(
        dedupe_key="k")] * 2, T0)
    first = (await claim(store, ttl=SEC)).claimed
    await store.work_renew_if_owner([i.fence for i in first if i.fence], SEC, lambda: T0)
    # The lease keeper's renewal of several families (one TTL each): one CASE UPDATE.
    fences = [i.fence for i in first if i.fence]
    await store.work_renew_groups([RenewGroup(tuple(fences[:1]), SEC),
                                   RenewGroup(tuple(fences[1:]), 2 * SEC)], lambda: T0)
    again = (await claim(store, "B", now=T0 + 5 * SEC)).claimed  # reclaims expired leases
    outcomes: list[Outcome] = [
        Succeeded(), RetryLater("x"), DeadLetter("x"), Released(), CancelAcknowledged(),
        Deferred("quota_wait", T0 + 6 * SEC),
    ]
    for item, outcome in zip(again, outcomes * 3, strict=False):
        await finalize(store, item, outcome, now=T0 + 5 * SEC)
    for item in first:  # stale finalizations take the read-back path
        await finalize(store, item, Succeeded(), now=T0 + 5 * SEC)
    dead = [i for i in again if (await store.work_get(i.work_id)).state.value == "dead"]  # type: ignore[union-attr]
    for item in dead:
        await store.work_replay(ReplayParams(work_id=item.work_id, actor="a", role="admin",
                                             reason="r"), T0)
    for item in await store.work_list(WorkQuery(limit=5, state=None, org_id="org-1")):
        await store.work_cancel(item.work_id, T0)
    await store.work_depths()
    await store.flow_sample(T0, T0 + 5 * SEC)
    await store.work_executions(again[0].work_id)
    await store.work_execution_totals("noop")
    await store.work_execution_summary("noop")
    # The console's history: its reads at a minute and an hour step, and the rebuild.
    await store.history_outcomes(T0, T0 + 3600 * SEC, 60 * SEC, "noop")
    await store.history_outcomes(T0, T0 + 86_400 * SEC, 3600 * SEC)
    await store.history_executions(T0, T0 + 60 * SEC, family="noop", outcome="dead", limit=5)
    # ... narrowed per org, binding and operation (the effect items'; migration 0048).
    narrow = ExecutionFilter(org="org-1", binding="b", operation="p")
    await store.history_outcomes(T0, T0 + 3600 * SEC, 60 * SEC, where=narrow)
    await store.history_executions(T0, T0 + 60 * SEC, family=None, outcome="dead", limit=5,
                                   where=narrow)
    await store.history_rebuild(T0)
    # Attempts spent with the lease expired: the dead sweep, journaled as lease_lost.
    await enqueue(store, 1, family="spent", max_attempts=1)
    await claim(store, family="spent", ttl=SEC)
    await claim(store, "C", family="spent", now=T0 + 5 * SEC)
    await store.work_count_open("noop")
    await store.audit_list()
    revision = PublishParams(revision=1, digest="sha256:x", content="{}", actor="a",
                             role="admin", reason="r")
    await store.catalog_publish(revision, T0)
    await store.catalog_publish(revision, T0)  # answered from the stored row
    await store.catalog_get(1)
    await store.catalog_digest(1)
    await store.catalog_list()
    await store.catalog_pins(1)
    await store.catalog_delete(1, actor="a", role="admin", reason="r", now_us=T0)
    await enqueue(store, 2, family="legacy")
    await store.work_rollback_fence("legacy", "f1", T0)
    legacy = await store.work_list(WorkQuery(family="legacy"))
    await store.work_legacy_reconcile(LegacyReceipt(legacy[0].work_id, "f1", 1, "d"), T0)
    await store.work_legacy_unknown(legacy[1].work_id, "f1", T0)
    await store.work_cutover_blockers("legacy")
    policy = QuotaPolicy(limit=10, window_us=SEC)
    granted = await store.quota_grant("q", policy, now_us=T0, count=2)
    await store.quota_throttle("q", policy, now_us=T0, retry_after_us=SEC)
    await store.quota_return("q", policy, getattr(granted, "slots", ())[1:], now_us=T0)
    await store.quota_keys()

    async def reserve(tx: SqlTx) -> None:
        rid = await reservation_open(tx, quota_key="q", slot_at_us=T0, expires_at_us=T0,
                                     work_id="W", ownership_epoch=1, now_us=T0)
        await reservation_move(tx, rid, ReservationState.SENT, now_us=T0, attempt_id="A")

    await store.db.transact(reserve, name="quota.reserve")
    await store.quota_reservations("W")
    await _credentials_workload(store)
    await _subscription_checkpoint_workload(store)
    await _effects_workload(store)
    await _cutover_workload(store)
    await _ingress_workload(store)
    await _retention_workload(store)


async def _subscription_checkpoint_workload(store: WorkStore) -> None:
    """A subscription step's pinned checkpoint, with and without the binding pin."""
    await enqueue(store, 1, family="subs")
    (item,) = (await claim(store, family="subs")).claimed
    assert item.fence is not None
    fence = item.fence
    draft = AttemptDraft(command_id=fence.work_id, method="POST", target_path="/x",
                         safe_headers="{}", body_sha256="sha256:x", idempotency_key="k",
                         pre_dispatch_evidence="{}")

    async def body(tx: SqlTx) -> None:
        await insert_attempt_pinned(tx, "P1", fence, draft, T0, binding_id="b",
                                    binding_generation=1)
        await insert_attempt_pinned(tx, "P2", fence, draft, T0, binding_id="b",
                                    binding_generation=None)
        kin = Kin(family="subs", subject_kind="lead", subject_id="lead-1", lane="subs:b",
                  key_prefix="subs:create:b:")
        await insert_attempt_pinned(tx, "P3", fence, draft, T0, binding_id="b",
                                    binding_generation=1, kin=kin)
        await unresolved_of_kin(tx, kin)
        await subjects_in_doubt(tx, kin)

    await store.work_fenced(fence, lambda: T0, body, name="subscriptions.checkpoint")

    async def last(tx: SqlTx) -> None:
        await last_items(tx, "subs", [fence.work_id, "b"])

    await store.db.transact(last, name="subscriptions.status", write=False)


async def _effects_workload(store: WorkStore) -> None:
    """The dispatch checkpoint with its pins (issue 20 item 2) and an operator's link bind
    (item 8): every statement they emit, refusals included."""
    from tests.support.commands import (
        TARGETS_SCOPE_DIGEST,
        accept_pinned,
        attempt,
        draft,
    )

    accepted = await accept_pinned(store, draft("int-guard", lead="lead-g"), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=60 * SEC)).claimed
    assert item.fence is not None
    await store.effect_checkpoint_many([(item.fence, attempt(accepted.command_id, "lead-g"))],
                                       lambda: T0)
    who = {"actor": "a", "role": "admin", "reason": "r"}
    await store.link_bind(TARGETS_SCOPE_DIGEST, "lead", "lead-b", "contact", "b1",
                          expected_generation=None, now_us=T0, **who)
    await store.link_bind(TARGETS_SCOPE_DIGEST, "lead", "lead-b", "contact", "b2",
                          expected_generation=1, now_us=T0, **who)
    with pytest.raises(WorkConflict):  # the attempt above is in flight: refused
        await store.link_bind(TARGETS_SCOPE_DIGEST, "lead", "lead-g", "contact", "g2",
                              expected_generation=1, now_us=T0, **who)


async def _cutover_workload(store: WorkStore) -> None:
    """Owner generations, the rollback fence, legacy receipts and the projector."""
    from sandbox.legacy import store as legacy
    from storage.cutover.legacy import LegacyOutcomeReceipt
    from tests.support.cutover import params
    from tests.support.legacy import sandbox_claimant

    # The sandbox's configured SQL adapter: its statements, as the operator wrote
    # them, go through the same guard (and verify runs each of them once).
    probe = sandbox_claimant("moved")
    await legacy.install(store)
    await probe.verify(store.db)
    (event,) = await legacy.add_events(store, "moved", ["{}"], T0)
    await store.claimant_heartbeat("l1", "legacy", "moved", 0, "stopped", T0)
    await store.cutover_begin(params("moved"), T0)
    await legacy.materialize(store, "moved", "org-1", T0)
    await store.cutover_commit(params("moved"), T0, probe)
    await store.cutover_snapshot("moved", T0, probe)
    await store.cutover_rollback_begin(params("moved"), T0)
    done = await store.cutover_rollback_commit(params("moved"), T0)
    assert done.receipt is not None and done.receipt.fence_id is not None
    claimed = await legacy.claim_one(store, "moved", "l1", SEC, T0)
    assert claimed is not None
    await legacy.finish(store, claimed, "l1", "succeeded", T0)
    (item,) = await store.work_list(WorkQuery(family="moved"))
    await store.legacy_receipt_record(LegacyOutcomeReceipt(
        item.work_id, done.receipt.fence_id, 2, "sha256:other", "dead"), T0)
    await store.legacy_project(T0)
    await store.legacy_fence_close(done.receipt.fence_id, T0)
    await store.legacy_fence_progress("moved")
    await store.cutover_receipts("moved")
    await store.cutover_fence_blockers("moved")
    await store.process_mark_gone("l1", params("moved"), T0)
    await legacy.events(store, "moved")
    assert event


async def _ingress_workload(store: WorkStore) -> None:
    """Receipts and normalized events: every statement they emit."""
    first, second = receipt(1), receipt(2)
    await store.ingress_receipt_insert(first, T0)
    await store.ingress_receipt_insert(receipt(3, key=first.dedup_key), T0)
    await store.ingress_receipt_insert(second, T0)
    await store.ingress_receipts_pending(10)
    await store.ingress_receipts_pending(10, ["r", "s"])
    await store.ingress_materialize(materialization(first), T0)
    await store.ingress_quarantine(QuarantineParams(receipt_id=second.receipt_id,
                                                    reason="malformed", detail="d"), T0)
    await store.ingress_receipt_get(first.receipt_id)
    await store.ingress_receipt_list(ReceiptQuery(state="received", route="r",
                                                  before_id="Z"))
    await store.ingress_events_of(first.receipt_id)
    await store.ingress_counts()
    # Retention's ingress rule: the quarantined receipt goes (and its events' DELETE
    # runs), the materialized one stays while its work is live (the guard's join).
    await prune(store, PAST_WORK)


async def _retention_workload(store: WorkStore) -> None:
    """Two pruner passes (the second resumes from the stored cursors), a busy lease,
    a lost one, the status read."""
    await prune(store, PAST_FACTS, batch_rows=2)
    await prune(store, PAST_FACTS + SEC, batch_rows=2)
    params = LeaseParams(holder="x", token="tx", ttl_us=60 * SEC, sweep_interval_us=SEC)
    await store.retention_lease_acquire(params, PAST_FACTS + 2 * SEC)
    await store.retention_lease_acquire(attrs.evolve(params, token="ty"), PAST_FACTS + 3 * SEC)
    await store.retention_lease_release(token="tx", summary={}, now_us=PAST_FACTS + 4 * SEC)
    await store.retention_status()


async def _credentials_workload(store: WorkStore) -> None:
    """Principal bindings, grants and refresh leases: every statement they emit."""
    key = TokenKey("k", bytes(32))
    facts = connect(binding_id="b", kind=PrincipalKind.SHARED, org_id="o",
                    app_installation_id="i", provider="p",
                    identity=BindingIdentity(issuer="x", remote_account_id="a",
                                             remote_subject="s"))
    who = Actor("a", "admin", "r")
    await store.binding_connect(facts, who, T0)
    await store.binding_transition("b", BindingEvent.DISCONNECT, who, expected_generation=1,
                                   now_us=T0)
    await store.binding_list("o")
    bundle = TokenBundle(access_token=SecretText("t"), refresh_token=SecretText("r"))
    await store.grant_install(binding_id="b", generation=1,
                              sealed=seal(bundle, key, BundleContext("b", 1, 1)),
                              expires_at_us=T0, now_us=T0)
    await store.grant_mark("b", 1, 1, GrantState.VALID, T0)
    await store.grant_list()

    async def lease(tx: SqlTx) -> None:
        await refresh_lease_acquire(tx, binding_id="b", generation=1, seen_version=1,
                                    lease_token="L", work_id="W", epoch=1, ttl_us=SEC,
                                    now_us=T0)

    await store.db.transact(lease, name="refresh.lease")
    await store.refresh_activate(binding_id="b", generation=1, lease_token="L",
                                 from_version=1,
                                 sealed=seal(bundle, key, BundleContext("b", 1, 2)),
                                 expires_at_us=T0, now_us=T0)
    await store.refresh_fail(binding_id="b", generation=1, lease_token="L", from_version=2,
                             reauthorize=grant_reason("invalid_grant"), now_us=T0)
    await store.refresh_unsent(binding_id="b", generation=1, lease_token="L",
                               from_version=2, now_us=T0)
    await store.refresh_count("b", 1)


async def test_every_statement_is_portable(backend: str, tmp_path: Path) -> None:
    async with fresh_database(backend, tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()
        recorder = RecordingDatabase(store.db)
        recorded = WorkStore(recorder, store.dialect)
        await _workload(recorded)
        assert len(recorder.seen) > 30, "the workload should reach most of the store"
        problems = [
            f"{label}: {sql[:120]}"
            for sql in sorted(recorder.seen)
            for label, pattern in BANNED.items()
            if re.search(pattern, sql, re.IGNORECASE | re.DOTALL)
        ]
        assert problems == []


@pytest.mark.parametrize(
    ("sql", "label"),
    [
        ("SELECT id FROM t WHERE x = ? FOR UPDATE SKIP LOCKED", "SKIP LOCKED"),
        ("UPDATE t SET a = 1 WHERE b = 2 LIMIT 10", "UPDATE ... LIMIT"),
        ("INSERT INTO t VALUES (?) ON DUPLICATE KEY UPDATE a = 1", "ON DUPLICATE KEY"),
        ("UPDATE t SET a = 1 RETURNING a", "RETURNING"),
        ("SELECT 1; SELECT 2", "multi-statement"),
        ("SELECT JSON_EXTRACT(payload, '$.a') FROM t", "JSON predicate"),
    ],
)
def test_guard_catches_banned_constructs(sql: str, label: str) -> None:
    assert re.search(BANNED[label], sql, re.IGNORECASE | re.DOTALL)
