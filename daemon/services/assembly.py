"""Build a replica's parts from the settings: catalog, HTTP client, handlers, API app.

The console is not one of them: the CLI (the composition root) builds it from
the catalog, so the services never import the console.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import attrs
from quart_trio import QuartTrio

from config.catalog import Catalog, load_catalog
from config.settings import Settings
from daemon.api.app import ApiContext, create_api_app
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from daemon.core.work import Fence, WorkItem
from daemon.providers.executor import BoundedHttp, HttpExecutor
from daemon.services.batcher import Batcher
from daemon.services.catalog_view import CatalogView
from daemon.services.checkpoints import CheckpointBatcher
from daemon.services.clock import Clock
from daemon.services.credentials import Credentials, build_credentials
from daemon.services.effect_runner import EffectRunner, effect_handler, replay_refusal
from daemon.services.families import FamilyRegistry, build_registry, noop_handler
from daemon.services.inbound_flow import InboundFlow, inbound_handler
from daemon.services.metrics import Metrics
from daemon.services.receipt_sender import ReceiptSender, receipt_handler
from daemon.services.reconcile import RECONCILE_FAMILY, CursorReconciler, reconcile_handler
from storage.commands import EFFECT_FAMILY
from storage.effects import RECEIPT_FAMILY, EffectContextRow
from storage.port import StorageError
from storage.work_store import WorkStore


@attrs.define(eq=False)
class Assembly:
    catalog: Catalog
    catalogs: CatalogView
    executor: HttpExecutor
    runtime_client: BoundedHttp
    registry: FamilyRegistry
    api_context: ApiContext | None
    api_app: QuartTrio | None

    # Where effects get their access tokens (static, or grants through the token owner).
    credentials: Credentials = attrs.Factory(Credentials)

    async def aclose(self) -> None:
        await self.executor.aclose()
        await self.runtime_client.aclose()
        await self.credentials.aclose()


def assemble(settings: Settings, store: WorkStore, clock: Clock,
             metrics: Metrics | None = None, *, catalog: Catalog | None = None) -> Assembly:
    """``catalog`` overrides the current Catalog the settings describe (tests that
    serve other L1 definitions than the shipped files)."""
    catalog = catalog if catalog is not None else load_catalog(settings)
    executor = HttpExecutor()

    def counted(operation: str, outcome: str) -> None:
        if metrics is not None:
            metrics.effect_attempts.labels(operation, outcome).inc()

    checkpoints = CheckpointBatcher(store, clock)
    contexts: Batcher[tuple[str, str], EffectContextRow | None] = Batcher(store.effect_contexts)
    catalogs = CatalogView(store, catalog)
    credentials = build_credentials(settings, store, clock, os.environ)
    runner = EffectRunner(
        catalog=catalog, catalogs=catalogs, executor=executor,
        receipt_max_attempts=settings.family(RECEIPT_FAMILY).max_attempts,
        on_attempt=counted, checkpoints=checkpoints, contexts=contexts,
        credentials=credentials,
    )
    if metrics is not None:
        runner.on_credential_failure = metrics.count_credential_failure
        runner.on_quota = metrics.count_quota
    runtime_client = BoundedHttp.open(16)

    async def prove_fences(fences: Sequence[Fence]) -> list[StorageError | None]:
        return await store.work_fences_live(fences, clock.now_us())

    # Receipt deliveries prove their claims live in shared transactions.
    fences: Batcher[Fence, None] = Batcher(prove_fences)
    sender = ReceiptSender(settings=settings, client=runtime_client, fences=fences)
    if metrics is not None:
        sender.on_result = metrics.count_receipt

    async def effect_replay_guard(store: WorkStore, item: WorkItem) -> str | None:
        if item.subject_kind == "command":
            # An older intent replayed after a newer one landed would overwrite it:
            # said first, as no other change (a repair, a new revision) can cure it.
            superseded = await store.command_superseded(item.subject_id)
            if superseded is not None:
                return superseded
        return await replay_refusal(catalogs, store, item)

    inbound = InboundFlow(settings=settings, catalog=catalog, catalogs=catalogs,
                          provider_http=executor.client, runtime_http=runtime_client)
    if metrics is not None:
        inbound.on_result = metrics.count_inbound
        inbound.on_lost_webhook = metrics.count_lost_webhook
    reconciler = CursorReconciler(
        catalog=catalog, catalogs=catalogs, http=executor.client,
        inbound_max_attempts=settings.family(INBOUND_APPLY_FAMILY).max_attempts)
    if metrics is not None:
        reconciler.on_complete = metrics.set_sync_complete
        reconciler.on_offered = metrics.count_reconcile_offered
    registry = build_registry(
        settings,
        {
            "noop": noop_handler,
            EFFECT_FAMILY: effect_handler(runner),
            RECEIPT_FAMILY: receipt_handler(sender),
            INBOUND_APPLY_FAMILY: inbound_handler(inbound),
            RECONCILE_FAMILY: reconcile_handler(reconciler),
        },
        {EFFECT_FAMILY: effect_replay_guard},
    )
    registry.services.extend([checkpoints.batcher.run, contexts.run, fences.run])
    context = None
    app = None
    if settings.runtimes:
        context = ApiContext(settings=settings, store=store, catalog=catalog, clock=clock,
                             catalogs=catalogs)
        if metrics is not None:
            context.on_admission = metrics.count_admission
        app = create_api_app(context)
    return Assembly(catalog, catalogs, executor, runtime_client, registry, context, app,
                    credentials)
