"""The materializer: IngressReceipt -> NormalizedEvent(s) -> one inbound_apply WorkItem each.

Theory of operation
-------------------
A loop reads receipts still ``received`` (oldest first), normalizes each body with the
pure :func:`daemon.core.ingress.normalize` under its route's L1 payload contract, and
settles it in one transaction (``storage.ingress.receipts.ingress_materialize``): the
receipt's state CAS, its immutable events and their WorkItems
(:class:`daemon.core.inbound_change.InboundChange` with ``origin="webhook"`` and the event
id, laned by the remote record). Every step is keyed (the state CAS, event ids derived
from the receipt id, WorkItem dedupe keys by event id), so a crash between any two steps
or two replicas materializing the same receipt never loses or doubles anything. A route
whose L1 contract declares a per-event identity gives each event its key
(:func:`daemon.core.ingress.event_key`): an event an earlier receipt already brought (a
provider that batches it again with new ones) is not created again, only counted
(``integrationd_ingress_duplicate_events_total``, the receipt's ``duplicate_events``).

A body that cannot be normalized is quarantined with its stable reason: the receipt and
its raw body stay, operators see it on the console, and nothing retries it blindly. A
receipt of a route this configuration no longer has stays ``received`` (a route removed by
mistake must not quarantine its backlog): the materializer reads only the receipts of its
configured routes, so such a receipt waits, counted on the console, without blocking the
others.

Never stalled by one receipt (issue 21): a pass settles its receipts in transactions
bounded by bytes as well as by rows (a settlement writes each receipt's events and
WorkItems, about as large as its body: at most ``max_statement_bytes`` of bodies a
transaction; the adapter cuts each batched INSERT to fit the statement limit). A
settlement that fails with an error of its own statements (:func:`storage.port.
deterministic`) is split in halves, down to the one receipt at fault, which is quarantined
with its stable reason: ``too_large_to_store`` (one of its rows is larger than the
database takes in one statement: MariaDB's ``max_allowed_packet``) or
``refused_by_database`` (the server refused a value of it). A failure of the database's
state (unreachable, an unknown COMMIT, contention) leaves the receipts ``received`` for
the next pass, counted by why (``integrationd_ingress_unsettled``: the console and the
IntegrationdIngressUnsettled alert say it).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import trio

from config.catalog import Catalog
from config.definitions import WebhookDefinition
from config.settings import BindingSettings, WebhookRoute
from daemon.core.inbound_change import BadInboundChange, InboundChange
from daemon.core.ingress import UNSETTLED_REASONS, Quarantine, event_key, normalize
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.metrics import Metrics
from storage.ingress.receipts import (
    IngressReceipt,
    Materialization,
    NormalizedEvent,
    QuarantineParams,
    Settled,
)
from storage.port import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    RetriesExhausted,
    RetryableConflict,
    StatementTooLarge,
    StorageError,
    StorageRefused,
    deterministic,
)
from storage.work_store import WorkStore

_Plan = tuple[IngressReceipt, Materialization | QuarantineParams]


def unsettled_reason(exc: StorageError) -> str:
    """Why a settlement left its receipts ``received`` (a label of
    ``integrationd_ingress_unsettled``)."""
    if isinstance(exc, CommitOutcomeUnknown):
        return "commit_unknown"
    if isinstance(exc, DatabaseUnavailable):
        return "database_unavailable"
    if isinstance(exc, RetriesExhausted | RetryableConflict):
        return "contention"
    return "storage_error"


def unstorable(receipt_id: str, exc: StorageError) -> QuarantineParams:
    """The quarantine of a receipt whose events or WorkItems the database cannot take:
    a stable reason and a sentence (sizes and codes, never values)."""
    if isinstance(exc, StatementTooLarge):
        return QuarantineParams(
            receipt_id=receipt_id, reason="too_large_to_store",
            detail=("one of its rows (its events and WorkItems) is larger than the database"
                    f" takes in one statement ({exc.limit} bytes: the server's"
                    " max_allowed_packet)"))
    code = exc.code if isinstance(exc, StorageRefused) else 0
    return QuarantineParams(
        receipt_id=receipt_id, reason="refused_by_database",
        detail=f"the database refused a value of its events or WorkItems (error {code})")


@attrs.define(eq=False)
class Materializer:
    store: WorkStore
    catalog: Catalog
    routes: Mapping[str, WebhookRoute]
    clock: Clock
    metrics: Metrics
    batch: int = 64
    interval_s: float = 0.5
    # The inbound_apply family's configured max_attempts (``[families.inbound_apply]``).
    max_attempts: int = attrs.field(kw_only=True)
    _wake: trio.Event = attrs.field(factory=trio.Event)
    # Receipts of the latest pass left ``received`` by a failed settlement, by why.
    unsettled: dict[str, int] = attrs.field(factory=dict)
    # Receipts quarantined instead of the plan they came with (their rows did not fit).
    _settled_plan: dict[str, Materialization | QuarantineParams] = attrs.field(factory=dict)

    def wake(self) -> None:
        self._wake.set()

    def _binding(self, route: WebhookRoute) -> BindingSettings | None:
        return self.catalog.binding(route.binding_id)

    async def accounts(self, receipts: list[IngressReceipt]) -> dict[str, str]:
        """The remote account each of these receipts' bindings names now (its durable
        fact: a rebind moves it; the configured one for a binding with no row yet)."""
        bindings = {b.binding_id: b for b in (
            self._binding(route) for route in (self.routes.get(r.route) for r in receipts)
            if route is not None) if b is not None}
        found = await self.store.binding_get_many(sorted(bindings))
        return {binding_id: (found[binding_id].identity.remote_account_id
                             if binding_id in found else b.remote_account_id)
                for binding_id, b in bindings.items()}

    def plan(self, receipt: IngressReceipt, accounts: Mapping[str, str] | None = None
             ) -> Materialization | QuarantineParams | None:
        """What settles one receipt (pure but for the catalog): its events and WorkItems,
        or its quarantine; None when its route is no longer configured. ``accounts``: the
        remote account each binding names now, pinned on the changes (the Flow refuses a
        change whose binding has since been rebound to another account)."""
        route = self.routes.get(receipt.route)
        webhook: WebhookDefinition | None = self.catalog.webhooks.get(receipt.webhook)
        binding = self._binding(route) if route is not None else None
        if route is None or webhook is None or binding is None:
            return None
        drafts = normalize(webhook.payload, receipt.body)
        if isinstance(drafts, Quarantine):
            return QuarantineParams(receipt_id=receipt.receipt_id, reason=drafts.reason,
                                    detail=drafts.detail)
        events: list[NormalizedEvent] = []
        specs = []
        try:
            for d in drafts:
                event_id = f"{receipt.receipt_id}:{d.index}"
                change = InboundChange(
                    provider=webhook.provider, binding=binding.binding_id,
                    resource_type=d.resource_type, resource_id=d.resource_id, kind=d.kind,
                    attributes=d.attributes, remote_updated_at=d.remote_updated_at,
                    origin="webhook", origin_id=event_id,
                    subscription_generation=receipt.subscription_generation,
                    remote_account=(accounts or {}).get(binding.binding_id))
                specs.append(change.work_spec(
                    org_id=binding.org_id, catalog_revision=self.catalog.revision,
                    catalog_digest=self.catalog.digest, max_attempts=self.max_attempts))
                events.append(NormalizedEvent(
                    event_id=event_id, receipt_id=receipt.receipt_id, event_index=d.index,
                    provider=webhook.provider, binding_id=binding.binding_id,
                    event_name=d.event_name, kind=d.kind, resource_type=d.resource_type,
                    resource_id=d.resource_id, delivered_at=d.delivered_at,
                    remote_updated_at=d.remote_updated_at,
                    subscription_generation=receipt.subscription_generation,
                    attributes=d.attributes,
                    identity_key=event_key(
                        route=receipt.route,
                        subscription_generation=receipt.subscription_generation,
                        identity=d.identity) if d.identity else None))
        except (BadInboundChange, ValueError) as exc:
            return QuarantineParams(receipt_id=receipt.receipt_id, reason="missing_field",
                                    detail=str(exc)[:200])
        return Materialization(receipt_id=receipt.receipt_id, events=tuple(events),
                               work=tuple(specs))

    async def settle_many(self, receipts: list[IngressReceipt]) -> list[str]:
        """Materialize or quarantine receipts (transactions bounded by bytes): per receipt
        ``materialized``, ``quarantined``, ``settled_elsewhere``, ``no_route`` or
        ``unsettled`` (a failure of the database's state: it stays ``received``)."""
        plans: list[_Plan] = []
        outcome: dict[str, str] = {}
        accounts = await self.accounts(receipts)
        for receipt in receipts:
            # Normalizing a batch is CPU on the event loop the ingress listener shares:
            # yield between receipts, so that a delivery waiting for its 200 is not held
            # behind the whole batch.
            await trio.lowlevel.checkpoint()
            plan = self.plan(receipt, accounts)
            if plan is None:
                logs.warn("ingress_receipt_without_route", receipt=receipt.receipt_id,
                          route=receipt.route[:64])
                outcome[receipt.receipt_id] = "no_route"
            else:
                plans.append((receipt, plan))
        unsettled: dict[str, int] = {}
        for group in self._groups(plans):
            answers = await self._settle_split(group)
            failed = [(r, a) for (r, _), a in zip(group, answers, strict=True)
                      if isinstance(a, StorageError)]
            for receipt, error in failed:
                reason = unsettled_reason(error)
                unsettled[reason] = unsettled.get(reason, 0) + 1
                outcome[receipt.receipt_id] = "unsettled"
            if failed:
                receipt, error = failed[0]
                if unsettled_reason(error) != "storage_error":
                    self.metrics.db_errors.labels("ingress_materialize").inc()
                logs.warn("ingress_materialize_failed", error=str(error)[:300],
                          reason=unsettled_reason(error), receipts=len(failed),
                          first_receipt=receipt.receipt_id)
            for (receipt, plan), done in zip(group, answers, strict=True):
                if isinstance(done, StorageError):
                    continue
                plan = self._settled_plan.pop(receipt.receipt_id, plan)
                if not done.won:
                    outcome[receipt.receipt_id] = "settled_elsewhere"
                elif isinstance(plan, Materialization):
                    outcome[receipt.receipt_id] = "materialized"
                    self.metrics.ingress_materialized.labels("materialized").inc()
                    if done.duplicate_events:
                        self.metrics.ingress_duplicate_events.inc(done.duplicate_events)
                        logs.event("ingress_duplicate_events", receipt=receipt.receipt_id,
                                   route=receipt.route, events=done.duplicate_events)
                else:
                    outcome[receipt.receipt_id] = "quarantined"
                    self.metrics.ingress_materialized.labels("quarantined").inc()
                    self.metrics.ingress_quarantined.labels(plan.reason).inc()
                    logs.warn("ingress_receipt_quarantined", receipt=receipt.receipt_id,
                              route=receipt.route, reason=plan.reason)
        self.unsettled = unsettled
        for reason in UNSETTLED_REASONS:
            self.metrics.ingress_unsettled.labels(reason).set(unsettled.get(reason, 0))
        return [outcome[r.receipt_id] for r in receipts]

    def _groups(self, plans: list[_Plan]) -> list[list[_Plan]]:
        """Consecutive plans, at most ``max_statement_bytes`` of bodies each (at least one
        plan): a settlement writes about its bodies' size in events and WorkItems."""
        budget = self.store.db.max_statement_bytes
        groups: list[list[_Plan]] = []
        size = 0
        for plan in plans:
            weight = len(plan[0].body) + 1024
            if groups and groups[-1] and size + weight <= budget:
                groups[-1].append(plan)
                size += weight
            else:
                groups.append([plan])
                size = weight
        return groups

    async def _settle_split(self, plans: list[_Plan]) -> list[Settled | StorageError]:
        """Settle ``plans`` in one transaction; a failure of its own statements is split
        down to the receipt at fault, which is quarantined (or, when even that cannot be
        written, answered with its error). The database's own failures answer every plan."""
        try:
            return list(await self.store.ingress_settle_counted(
                [p for _, p in plans], self.clock.now_us()))
        except StorageError as exc:
            if not deterministic(exc):
                return [exc] * len(plans)
            failed = exc
        if len(plans) > 1:
            self.metrics.batch_splits.labels("ingress_settle").inc()
            half = len(plans) // 2
            return [*await self._settle_split(plans[:half]),
                    *await self._settle_split(plans[half:])]
        ((receipt, plan),) = plans
        if isinstance(plan, QuarantineParams):
            return [failed]
        quarantine = unstorable(receipt.receipt_id, failed)
        try:
            (done,) = await self.store.ingress_settle_counted([quarantine],
                                                              self.clock.now_us())
        except StorageError as exc:
            return [exc]
        self._settled_plan[receipt.receipt_id] = quarantine
        return [done]

    async def settle(self, receipt: IngressReceipt) -> str:
        (outcome,) = await self.settle_many([receipt])
        return outcome

    async def run_once(self) -> int:
        """Settle one batch of pending receipts (one transaction); how many were settled
        here."""
        pending = await self.store.ingress_receipts_pending(self.batch, sorted(self.routes))
        if not pending:
            return 0
        outcomes = await self.settle_many(pending)
        return sum(o in ("materialized", "quarantined") for o in outcomes)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            try:
                settled = await self.run_once()
            except StorageError as exc:  # reading the pending receipts failed
                self.metrics.db_errors.labels("ingress_materialize").inc()
                logs.warn("ingress_materialize_failed", error=str(exc)[:300])
                settled = 0
            if settled >= self.batch:
                continue
            with trio.move_on_after(self.interval_s):
                await self._wake.wait()
            self._wake = trio.Event()
