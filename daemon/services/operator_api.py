"""Operator actions shared by the CLI and (later) the admin UI's JSON API.

Authorization is checked at request time against the *current* settings:
the caller names an actor, the actor's role must allow the action, and every
state-changing action is written to the append-only audit log in the same
transaction as the change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from config.catalog import load_catalog
from config.settings import Operator, Settings
from daemon.core.cancel import CancelRule
from daemon.core.states import WorkState
from daemon.core.work import WorkItem, WorkSpec
from daemon.services.clock import Clock
from daemon.services.families import FamilyRegistry
from storage.port import (
    CancelParams,
    CancelResult,
    Execution,
    ReplayParams,
    WorkConflict,
    WorkQuery,
)
from storage.work_store import WorkStore

MAX_PAYLOAD_BYTES = 64 * 1024
ENQUEUE_CHUNK = 1000

ACTION_ROLES: dict[str, frozenset[str]] = {
    "work.read": frozenset({"viewer", "operator", "admin"}),
    "work.enqueue": frozenset({"operator", "admin"}),
    "work.cancel": frozenset({"operator", "admin"}),
    "work.replay": frozenset({"operator", "admin"}),
    # Retire or repair an effect command (the CLI's `command` verbs; the console's own).
    "command.repair": frozenset({"operator", "admin"}),
    "catalog.read": frozenset({"viewer", "operator", "admin"}),
    "catalog.publish": frozenset({"admin"}),
    "catalog.delete": frozenset({"admin"}),
    "reconcile.start": frozenset({"operator", "admin"}),
    "reconcile.repair": frozenset({"operator", "admin"}),
    "subscriptions.reconcile": frozenset({"operator", "admin"}),
    "cutover.read": frozenset({"viewer", "operator", "admin"}),
    "cutover.step": frozenset({"admin"}),
    # Disconnect / reconnect a principal binding (the CLI's `binding` verbs, the console).
    "bindings.transition": frozenset({"operator", "admin"}),
    # RemoteLinks (`integrationd link`, the console's effects page): binding a local
    # record to a remote one chooses an identity, so admins only.
    "link.read": frozenset({"viewer", "operator", "admin"}),
    "link.bind": frozenset({"admin"}),
}


class NotAuthorized(Exception):
    """The actor is unknown or their role does not allow the action."""


class BadRequest(Exception):
    """Input an operator can fix (bad JSON, unknown state...)."""


def authorize(settings: Settings, actor: str, action: str) -> Operator:
    operator = settings.operator(actor)
    if operator is None:
        raise NotAuthorized(f"{actor!r} is not a configured operator")
    if operator.role not in ACTION_ROLES[action]:
        raise NotAuthorized(f"{actor!r} ({operator.role}) may not {action}")
    return operator


def parse_payload(text: str) -> str:
    """Validate an operator-supplied payload: a JSON object within the size limit."""
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise BadRequest(f"payload is larger than {MAX_PAYLOAD_BYTES} bytes")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"payload is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(doc, dict):
        raise BadRequest("payload must be a JSON object")
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def parse_state(text: str | None) -> WorkState | None:
    if text is None:
        return None
    try:
        return WorkState(text)
    except ValueError:
        known = ", ".join(s.value for s in WorkState)
        raise BadRequest(f"unknown state {text!r} (known: {known})") from None


@attrs.frozen(kw_only=True)
class EnqueueRequest:
    family: str
    count: int = 1
    org_id: str = "org-demo"
    payload: str = "{}"
    source_lane: str | None = None
    target_lane: str | None = None
    delay_s: float = 0.0
    subject_kind: str = "demo"


async def enqueue(
    store: WorkStore, registry: FamilyRegistry, clock: Clock, request: EnqueueRequest
) -> list[str]:
    """Enqueue ``count`` items of a known family; refuse unknown families."""
    family = registry.get(request.family)
    if request.count < 1:
        raise BadRequest("count must be at least 1")
    payload = parse_payload(request.payload)
    now = clock.now_us()
    run_after = now + int(request.delay_s * 1_000_000)
    ids: list[str] = []
    remaining = request.count
    while remaining:
        n = min(remaining, ENQUEUE_CHUNK)
        specs = [
            WorkSpec(
                family=family.name,
                org_id=request.org_id,
                subject_kind=request.subject_kind,
                subject_id=f"{request.subject_kind}-{len(ids) + i}",
                payload=payload,
                source_lane=request.source_lane,
                target_lane=request.target_lane,
                max_attempts=family.settings.max_attempts,
                run_after_us=run_after,
            )
            for i in range(n)
        ]
        results = await store.work_enqueue(specs, now)
        ids.extend(r.work_id for r in results)
        remaining -= n
    return ids


async def replay(
    store: WorkStore,
    settings: Settings,
    registry: FamilyRegistry,
    clock: Clock,
    *,
    work_id: str,
    actor: str,
    reason: str,
) -> WorkItem:
    """Replay a terminal item as a new one with lineage, after authorizing ``actor``."""
    operator = authorize(settings, actor, "work.replay")
    if not reason.strip():
        raise BadRequest("a replay needs a reason")
    item = await store.work_get(work_id)
    if item is not None:
        # Resolve the current definition explicitly: a family this build no
        # longer runs cannot be replayed, and a family may refuse a replay
        # whose identity, authority or idempotency is ambiguous right now.
        family = registry.get(item.family)
        if family.replay_guard is not None:
            refusal = await family.replay_guard(store, item)
            if refusal is not None:
                raise WorkConflict(f"work {work_id} cannot be replayed: {refusal}")
    current = load_catalog(settings)  # resolved explicitly, recorded in the audit entry
    return await store.work_replay(
        ReplayParams(work_id=work_id, actor=operator.name, role=operator.role, reason=reason,
                     resolved_catalog=(current.revision, current.digest)),
        clock.now_us(),
    )


async def cancel(store: WorkStore, settings: Settings, clock: Clock, *, work_id: str,
                 actor: str, reason: str,
                 rules: Mapping[str, CancelRule] | None = None) -> CancelResult:
    """Cancel unclaimed work, or ask its claimant to stop, as the item's family rule
    allows (``rules``); audited with the change. A terminal item, or one the rule
    protects, is refused (:class:`storage.work_admin.CancelRefused`)."""
    operator = authorize(settings, actor, "work.cancel")
    if not reason.strip():
        raise BadRequest("a cancel needs a reason")
    return await store.work_cancel_audited(
        CancelParams(work_id=work_id, actor=operator.name, role=operator.role, reason=reason),
        clock.now_us(), rules,
    )


async def list_items(store: WorkStore, query: WorkQuery) -> list[WorkItem]:
    return await store.work_list(query)


async def operator_path_json(store: WorkStore, settings: Settings,
                             item: WorkItem) -> dict[str, Any] | None:
    """For a command's work item: the command's effect state and the one action that
    leads to its Runtime receipt, from the operator-path table, judged against the
    Catalog revision this configuration serves (``work show``; the console shows the
    same). None for other items."""
    if item.subject_kind != "command":
        return None
    current = load_catalog(settings)
    path = await store.command_operator_path(item.subject_id,
                                             (current.revision, current.digest))
    return None if path is None else {"command_id": item.subject_id} | path.as_json()


async def command_facts_json(store: WorkStore, command_id: str) -> dict[str, Any]:
    """For a command's work item, what the console's item page shows beside it: the
    command (its settlement and pins, never its request body), each effect attempt (what
    was sent and what came back, safe fields only) and the Runtime receipt's state."""
    command = await store.command_get(command_id)
    if command is None:
        return {}
    receipt = await store.receipt_get(command_id)
    return {
        "command": {"command_id": command.command_id, "settlement": command.settlement.value,
                    "operation": command.operation, "intent_id": command.intent_id,
                    "binding_id": command.binding_id,
                    "binding_generation": command.binding_generation,
                    "catalog_revision": command.catalog_revision,
                    "remote_id": command.remote_id, "repair_of": command.repair_of},
        "effect_attempts": [
            {"attempt_id": a.attempt_id, "ownership_epoch": a.ownership_epoch,
             "method": a.method, "target_path": a.target_path,
             "dispatch_started_at_us": a.dispatch_started_at_us,
             "response_status": a.response_status, "outcome": a.outcome,
             "failure_class": a.failure_class, "evidence": a.evidence,
             "disposition": a.disposition, "finished_at_us": a.finished_at_us}
            for a in await store.effect_attempts(command_id)],
        "receipt": None if receipt is None else {
            "state": receipt.state.value, "result_format_version": receipt.result_format_version},
    }


def item_json(item: WorkItem, executions: list[Execution] | None = None) -> dict[str, Any]:
    """A WorkItem as JSON for operators. The payload is not included (it may be sensitive)."""
    doc = attrs.asdict(item)
    doc["state"] = item.state.value
    doc.pop("payload", None)
    # The fence token authorizes writes; operators see the epoch instead.
    doc.pop("lease_token", None)
    doc["payload_bytes"] = len(item.payload.encode())
    if executions is not None:
        doc["executions"] = [attrs.asdict(e) for e in executions]
    return doc
