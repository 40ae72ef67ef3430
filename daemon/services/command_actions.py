"""Retire and repair a command: the one shell both the console and the CLI call.

The operator is authorized by the caller (the console against its session's role,
the CLI against ``[[operators]]``). What is decided here is only what needs the
configuration: the repair pins the durable binding's current generation, the
Catalog revision this replica serves, and the remote link the binding's account
names. Whether the action is allowed from the command's effect state, and the
receipt it leads to, is the operator-path table's, decided by the store inside
the action's own transaction (:mod:`storage.command_operator`).
"""

from __future__ import annotations

from config.catalog import Catalog
from config.settings import Settings
from daemon.core.identity import integration_link_key_v2
from daemon.core.principals import BindingState, scope_digest
from daemon.services.operator_api import BadRequest
from storage.command_repair import RepairActor
from storage.commands import EFFECT_FAMILY
from storage.effect_values import Settlement
from storage.effects import RECEIPT_FAMILY
from storage.port import WorkNotFound
from storage.work_store import WorkStore


async def retire_command(store: WorkStore, settings: Settings, command_id: str,
                         who: RepairActor, now_us: int) -> Settlement:
    """Retire: settles what the lineage proves (success, no effect) or retires it
    without a receipt; refused as the table says."""
    return await store.command_retire(
        command_id, who, receipt_max_attempts=settings.family(RECEIPT_FAMILY).max_attempts,
        now_us=now_us)


async def repair_command(store: WorkStore, settings: Settings, catalog: Catalog,
                         command_id: str, who: RepairActor, now_us: int) -> str:
    """A new command with repair lineage, pinned anew; its id."""
    command = await store.command_get(command_id)
    if command is None:
        raise WorkNotFound(command_id)
    if catalog.binding(command.binding_id) is None:
        raise BadRequest(f"binding {command.binding_id} is no longer configured")
    # The repair pins the durable binding's generation as it is now.
    principal = await store.binding_get(command.binding_id)
    if principal is None or principal.state is not BindingState.CONNECTED:
        raise BadRequest(f"binding {command.binding_id} is not connected: reconnect it"
                         " first (integrationd binding reconnect)")
    return await store.command_repair(
        command_id, who, binding_generation=principal.generation,
        catalog_revision=catalog.revision, catalog_digest=catalog.digest,
        max_attempts=settings.family(EFFECT_FAMILY).max_attempts, now_us=now_us,
        # The repair pins the link the durable binding's account names, as it is now.
        link_key=integration_link_key_v2(scope_digest(principal), command.local_object,
                                         command.local_id),
    )
