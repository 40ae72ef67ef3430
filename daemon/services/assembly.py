"""Build a replica's parts from the settings: catalog, HTTP client, handlers, API app.

The console is not one of them: the CLI (the composition root) builds it from
the catalog, so the services never import the console.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import attrs
from quart_trio import QuartTrio

from config.catalog import Catalog, load_catalog
from config.keys import load_token_keys
from config.settings import Settings
from daemon.api.app import ApiContext, create_api_app
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from daemon.core.work import Fence, WorkItem
from daemon.providers.executor import BoundedHttp, HttpExecutor, keepalive_below, origin_of
from daemon.services import logs
from daemon.services.batcher import Batcher
from daemon.services.catalog_view import CatalogView
from daemon.services.checkpoints import CheckpointBatcher
from daemon.services.clock import Clock
from daemon.services.credentials import Credentials, build_credentials, connect_flow_key
from daemon.services.effect_quota import declared_keys
from daemon.services.effect_runner import EffectRunner, effect_handler, replay_refusal
from daemon.services.families import FamilyRegistry, build_registry, noop_handler
from daemon.services.inbound_flow import InboundFlow, inbound_handler
from daemon.services.ingress import IngressApp, bind_routes
from daemon.services.ingress_spool import IngressSpool, SpoolForwarder
from daemon.services.materializer import Materializer
from daemon.services.metrics import Metrics
from daemon.services.receipt_batches import ReceiptBatches
from daemon.services.receipt_sender import ReceiptSender, receipt_handler
from daemon.services.reconcile import RECONCILE_FAMILY, CursorReconciler, reconcile_handler
from daemon.services.secret_retirements import SecretRetirements
from daemon.services.subscription_calls import SubscriptionCalls
from daemon.services.subscription_operator import (
    replay_refusal as subscription_replay_refusal,
)
from daemon.services.subscriptions import (
    SUBSCRIPTION_FAMILY,
    SubscriptionReconciler,
    subscription_handler,
)
from storage.commands import EFFECT_FAMILY
from storage.effects import RECEIPT_FAMILY, EffectContextRow
from storage.ingress.receipts import IngressReceipt, ReceiptInsert
from storage.port import SqlTx, StorageError
from storage.secret_retirements import retired_previous_secrets
from storage.work_store import WorkStore


@attrs.define(eq=False)
class Ingress:
    """The webhook ingress parts: the listener's app, its spool, forwarder, materializer."""

    app: IngressApp
    spool: IngressSpool
    forwarder: SpoolForwarder
    materializer: Materializer
    receipts: Batcher[IngressReceipt, ReceiptInsert]


def build_ingress(settings: Settings, store: WorkStore, clock: Clock, metrics: Metrics,
                  catalog: Catalog) -> Ingress | None:
    """The ingress parts, when ``[[webhook_routes]]`` are configured and ``[ingress] listen``
    is set. The spool directory is created and its leftover segments counted here."""
    s = settings.ingress
    if not settings.webhook_routes or not s.listen:
        return None
    directory = Path(s.spool_dir)
    if not directory.is_absolute():
        directory = Path(settings.base_dir) / directory
    spool = IngressSpool(directory, s.spool_max_bytes, on_change=metrics.set_spool)
    spool.open()
    if s.max_body_bytes * 6 > store.db.max_statement_bytes:
        # A body's event attributes may take six bytes a character of it (JSON escapes):
        # such a receipt would be quarantined (too_large_to_store), or refused before its
        # 200 when even its body does not fit.
        logs.warn("ingress_body_limit_over_database", max_body_bytes=s.max_body_bytes,
                  max_statement_bytes=store.db.max_statement_bytes)

    async def flush(batch: Sequence[IngressReceipt]) -> Sequence[ReceiptInsert | StorageError]:
        return await store.ingress_receipts_insert(batch, clock.now_us())

    # Concurrent deliveries' receipts share one transaction (one fsync / COMMIT).
    # Bounded by bytes too (a row is the body as base64 plus its columns): a burst of large
    # bodies is several transactions, each within the database's statement limit.
    receipts: Batcher[IngressReceipt, ReceiptInsert] = Batcher(
        flush, max_batch=256, weigh=lambda r: len(r.body) * 4 // 3 + 1024,
        max_bytes=lambda: store.db.max_statement_bytes,
        on_split=metrics.batch_splits.labels("ingress_receipt").inc)

    async def insert(receipt: IngressReceipt, now_us: int) -> ReceiptInsert:
        return await receipts.submit(receipt)

    app = IngressApp(settings=s, routes=bind_routes(settings.webhook_routes, catalog.webhooks),
                     clock=clock, insert=insert, spool=spool, metrics=metrics)

    async def forward(receipt: IngressReceipt) -> object:
        return await store.ingress_receipt_insert(receipt, clock.now_us())

    forwarder = SpoolForwarder(spool, forward, interval_s=s.forward_interval,
                               on_forwarded=metrics.ingress_spool_forwarded.inc)
    materializer = Materializer(store=store, catalog=catalog,
                                routes={r.route: r for r in settings.webhook_routes},
                                clock=clock, metrics=metrics, batch=s.materialize_batch,
                                interval_s=s.materialize_interval,
                                max_attempts=settings.family(INBOUND_APPLY_FAMILY).max_attempts)
    app.on_stored = materializer.wake

    async def load_retired() -> set[tuple[str, int]]:
        async def body(tx: SqlTx) -> set[tuple[str, int]]:
            return await retired_previous_secrets(tx)

        found: set[tuple[str, int]] = await store.db.transact(
            body, name="secret_retirements.read", write=False)
        return found

    app.retirements = SecretRetirements(
        load_retired, watched=frozenset((r.route, r.secret_generation)
                                        for r in settings.webhook_routes
                                        if r.previous_secret is not None),
        deadline_s=s.db_deadline, on_state=metrics.set_previous_secret)
    return Ingress(app, spool, forwarder, materializer, receipts)


@attrs.define(eq=False)
class Assembly:
    catalog: Catalog
    catalogs: CatalogView
    executor: HttpExecutor
    runtime_client: BoundedHttp
    registry: FamilyRegistry
    api_context: ApiContext | None
    api_app: QuartTrio | None
    ingress: Ingress | None = None

    # Where effects get their access tokens (static, or grants through the token owner).
    credentials: Credentials = attrs.Factory(Credentials)

    async def aclose(self) -> None:
        await self.executor.aclose()
        await self.runtime_client.aclose()
        await self.credentials.aclose()


def provider_keepalive(catalog: Catalog) -> dict[str, float]:
    """Each binding's origin and how long its pooled connections may idle: below what its
    provider's L1 declares (``keep_alive``), else the safe default."""
    declared = {op.provider: op.keep_alive_s for op in catalog.operations.values()}
    return {origin_of(b.base_url): keepalive_below(declared.get(b.provider))
            for b in catalog.bindings if b.base_url}


def assemble(settings: Settings, store: WorkStore, clock: Clock,
             metrics: Metrics | None = None, *, catalog: Catalog | None = None) -> Assembly:
    """``catalog`` overrides the current Catalog the settings describe (tests that
    serve other L1 definitions than the shipped files)."""
    catalog = catalog if catalog is not None else load_catalog(settings)
    executor = HttpExecutor(BoundedHttp.open(32, provider_keepalive(catalog)))

    def counted(operation: str, outcome: str) -> None:
        if metrics is not None:
            metrics.effect_attempts.labels(operation, outcome).inc()

    checkpoints = CheckpointBatcher(store, clock)
    contexts: Batcher[tuple[str, str], EffectContextRow | None] = Batcher(store.effect_contexts)
    if metrics is not None:
        checkpoints.batcher.on_split = metrics.batch_splits.labels("effect_checkpoint").inc
        contexts.on_split = metrics.batch_splits.labels("effect_context").inc
    catalogs = CatalogView(store, catalog)
    credentials = build_credentials(settings, store, clock, os.environ)
    runner = EffectRunner(
        catalog=catalog, catalogs=catalogs, executor=executor,
        receipt_max_attempts=settings.family(RECEIPT_FAMILY).max_attempts,
        on_attempt=counted, checkpoints=checkpoints, contexts=contexts,
        credentials=credentials, quota_clock_spread_us=settings.work.clock_spread_us,
    )
    if metrics is not None:
        runner.on_credential_failure = metrics.count_credential_failure
        runner.on_quota = metrics.count_quota
        runner.on_quota_reset_ignored = metrics.count_quota_reset_ignored
        metrics.quota_declared = declared_keys(
            catalog.operations.values(), catalog.bindings,
            clock_spread_us=settings.work.clock_spread_us)
    runtime_client = BoundedHttp.open(16, {
        origin_of(url): keepalive_below(rc.keep_alive)
        for rc in settings.runtimes for url in (rc.results_url, rc.results_batch_url) if url})

    async def prove_fences(fences: Sequence[Fence]) -> list[StorageError | None]:
        return await store.work_fences_live(fences, clock.now_us)

    # Receipt deliveries prove their claims live in shared transactions.
    fences: Batcher[Fence, None] = Batcher(prove_fences)
    if metrics is not None:
        fences.on_split = metrics.batch_splits.labels("receipt_fence").inc
    # Runtimes that serve the batch route get many receipts to a request.
    batches = ReceiptBatches(client=runtime_client, prove=prove_fences)
    if metrics is not None:
        batches.on_split = metrics.batch_splits.labels("receipt_fence").inc
    receipt_batchers = [batches.add(rc) for rc in settings.runtimes if rc.results_batch_url]
    sender = ReceiptSender(settings=settings, client=runtime_client, fences=fences,
                           batches=batches)
    if metrics is not None:
        sender.on_result = metrics.count_receipt

    async def effect_replay_guard(store: WorkStore, item: WorkItem) -> str | None:
        # The configuration's half only: the rest is decided in the replay's own
        # transaction (storage/command_operator.py), after it took the command's row.
        if item.subject_kind != "command":
            return None
        return await replay_refusal(catalogs, store, item)

    inbound = InboundFlow(settings=settings, catalog=catalog, catalogs=catalogs,
                          provider_http=executor.client, runtime_http=runtime_client,
                          credentials=credentials)
    if metrics is not None:
        inbound.on_result = metrics.count_inbound
        inbound.on_lost_webhook = metrics.count_lost_webhook
        inbound.on_quota = metrics.count_quota
        inbound.on_quota_reset_ignored = metrics.count_quota_reset_ignored
    reconciler = CursorReconciler(
        catalog=catalog, catalogs=catalogs, http=executor.client,
        inbound_max_attempts=settings.family(INBOUND_APPLY_FAMILY).max_attempts,
        max_attempts=settings.family(RECONCILE_FAMILY).max_attempts,
        credentials=credentials, quota_clock_spread_us=settings.work.clock_spread_us)
    if metrics is not None:
        reconciler.on_complete = metrics.set_sync_complete
        reconciler.on_offered = metrics.count_reconcile_offered
        reconciler.on_quota = metrics.count_quota
        reconciler.on_quota_reset_ignored = metrics.count_quota_reset_ignored
    # Subscription calls go out the way effects do: the same HTTP client, credential
    # service and quota ledger (daemon/services/subscription_calls.py).
    calls = SubscriptionCalls(http=executor.client, credentials=credentials,
                              operations=tuple(catalog.operations.values()),
                              quota_clock_spread_us=settings.work.clock_spread_us)
    subscriptions = SubscriptionReconciler(
        catalog=catalog, routes=settings.webhook_routes, calls=calls,
        max_attempts=settings.family(SUBSCRIPTION_FAMILY).max_attempts,
        # Cleanup tokens are sealed with the active token key (none: not kept).
        keys=load_token_keys(settings.keys, os.environ, settings.base_dir)
        if settings.keys.active else {}, seal_key_id=settings.keys.active or None)
    if metrics is not None:
        subscriptions.on_run = metrics.set_subscriptions
        calls.on_quota = metrics.count_quota
        calls.on_quota_reset_ignored = metrics.count_quota_reset_ignored
        calls.on_credential_failure = metrics.count_credential_failure
    registry = build_registry(
        settings,
        {
            "noop": noop_handler,
            EFFECT_FAMILY: effect_handler(runner),
            RECEIPT_FAMILY: receipt_handler(sender),
            INBOUND_APPLY_FAMILY: inbound_handler(inbound),
            RECONCILE_FAMILY: reconcile_handler(reconciler),
            SUBSCRIPTION_FAMILY: subscription_handler(subscriptions),
        },
        {EFFECT_FAMILY: effect_replay_guard,
         SUBSCRIPTION_FAMILY: subscription_replay_refusal},
    )
    registry.services.extend([checkpoints.batcher.run, contexts.run, fences.run,
                              *(b.run for b in receipt_batchers)])
    context = None
    app = None
    if settings.runtimes:
        context = ApiContext(settings=settings, store=store, catalog=catalog, clock=clock,
                             catalogs=catalogs, token_key=connect_flow_key(settings, os.environ))
        if metrics is not None:
            context.on_admission = metrics.count_admission
        app = create_api_app(context)
    ingress = None
    if metrics is not None:
        ingress = build_ingress(settings, store, clock, metrics, catalog)
        if ingress is not None:
            registry.services.extend([ingress.receipts.run, ingress.forwarder.run,
                                      ingress.materializer.run])
            if ingress.app.retirements is not None:
                registry.services.append(ingress.app.retirements.run)
    return Assembly(catalog, catalogs, executor, runtime_client, registry, context, app,
                    ingress, credentials)
