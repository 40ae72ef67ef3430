"""Build a replica's parts from the settings: catalog, HTTP client, handlers, API app."""

from __future__ import annotations

import attrs
from quart_trio import QuartTrio

from admin_ui.effects import effect_extensions
from admin_ui.extensions import ConsoleExtensions
from config.catalog import Catalog, load_catalog
from config.settings import Settings
from daemon.api.app import ApiContext, create_api_app
from daemon.core.work import WorkItem
from daemon.providers.executor import BoundedHttp, HttpExecutor
from daemon.services.batcher import Batcher
from daemon.services.checkpoints import CheckpointBatcher
from daemon.services.clock import Clock
from daemon.services.effect_runner import EffectRunner, effect_handler, replay_refusal
from daemon.services.families import FamilyRegistry, build_registry, noop_handler
from daemon.services.metrics import Metrics
from daemon.services.receipt_sender import ReceiptSender, receipt_handler
from storage.commands import EFFECT_FAMILY
from storage.effects import RECEIPT_FAMILY, EffectContextRow
from storage.work_store import WorkStore


@attrs.define(eq=False)
class Assembly:
    catalog: Catalog
    executor: HttpExecutor
    runtime_client: BoundedHttp
    registry: FamilyRegistry
    api_context: ApiContext | None
    api_app: QuartTrio | None
    console_extensions: ConsoleExtensions

    async def aclose(self) -> None:
        await self.executor.aclose()
        await self.runtime_client.aclose()


def assemble(settings: Settings, store: WorkStore, clock: Clock,
             metrics: Metrics | None = None) -> Assembly:
    catalog = load_catalog(settings)
    executor = HttpExecutor()

    def counted(operation: str, outcome: str) -> None:
        if metrics is not None:
            metrics.effect_attempts.labels(operation, outcome).inc()

    checkpoints = CheckpointBatcher(store, clock)
    contexts: Batcher[tuple[str, str], EffectContextRow | None] = Batcher(store.effect_contexts)
    runner = EffectRunner(
        catalog=catalog, executor=executor,
        receipt_max_attempts=settings.family(RECEIPT_FAMILY).max_attempts,
        on_attempt=counted, checkpoints=checkpoints, contexts=contexts,
    )
    runtime_client = BoundedHttp.open(16)
    sender = ReceiptSender(settings=settings, client=runtime_client)
    if metrics is not None:
        sender.on_result = metrics.count_receipt
    async def effect_replay_guard(store: WorkStore, item: WorkItem) -> str | None:
        return await replay_refusal(catalog, store, item)

    registry = build_registry(
        settings,
        {
            "noop": noop_handler,
            EFFECT_FAMILY: effect_handler(runner),
            RECEIPT_FAMILY: receipt_handler(sender),
        },
        {EFFECT_FAMILY: effect_replay_guard},
    )
    registry.services.extend([checkpoints.batcher.run, contexts.run])
    context = None
    app = None
    if settings.runtimes:
        context = ApiContext(settings=settings, store=store, catalog=catalog, clock=clock)
        if metrics is not None:
            context.on_admission = metrics.count_admission
        app = create_api_app(context)
    return Assembly(catalog, executor, runtime_client, registry, context, app,
                    effect_extensions(catalog))
