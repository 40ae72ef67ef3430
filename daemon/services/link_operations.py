"""Operator RemoteLink actions shared by the CLI (``integrationd link ...``) and the console.

``bind``: "this local record is that remote record", for a configured binding's durable
remote account (the scope new work uses: docs/identity.md). Admins only (it chooses an
identity), authorized against the current settings at request time, audited in the
transaction that makes the change (:func:`storage.links.bind_link`); a refusal names a
stable code and a sentence and writes nothing. ``show``: the link of one local record.
"""

from __future__ import annotations

from typing import Any

from config.settings import Settings
from daemon.core.identity import BadCoordinate
from daemon.core.principals import scope_digest
from daemon.services.clock import Clock
from daemon.services.operator_api import BadRequest, authorize
from storage.effect_values import RemoteLink
from storage.links import LinkBound
from storage.work_store import WorkStore

MAX_COORDINATE = 255
MAX_REASON = 500


def coordinate(name: str, value: str) -> str:
    """One id an operator typed: non-empty, printable, bounded (refused with the field)."""
    text = value.strip()
    if not text or len(text) > MAX_COORDINATE or not text.isprintable():
        raise BadRequest(f"invalid_input: {name} must be 1 to {MAX_COORDINATE} printable"
                         " characters")
    return text


async def _scope(store: WorkStore, settings: Settings, binding_id: str) -> str:
    if not any(b.binding_id == binding_id for b in settings.bindings):
        raise BadRequest(f"unknown_binding: binding {binding_id!r} is not configured")
    principal = await store.binding_get(binding_id)
    if principal is None:
        raise BadRequest(f"unknown_binding: binding {binding_id!r} has no durable row yet"
                         " (it is created when the daemon starts)")
    return scope_digest(principal)


async def bind_remote_record(
    store: WorkStore, settings: Settings, clock: Clock, *, actor: str, binding_id: str,
    local_object: str, local_id: str, remote_object: str, remote_id: str,
    expected_generation: int | None, reason: str,
) -> LinkBound:
    """Bind ``local_object``/``local_id`` to the existing remote record (adopt, or rebind
    an active link whose generation the operator names): see
    :func:`daemon.core.link_bind.decide_bind`."""
    operator = authorize(settings, actor, "link.bind")
    text = " ".join(reason.split())
    if not text or len(text) > MAX_REASON or not text.isprintable():
        raise BadRequest(f"invalid_input: a reason of 1 to {MAX_REASON} printable characters"
                         " is required (it is kept in the audit log)")
    if expected_generation is not None and expected_generation < 1:
        raise BadRequest("invalid_input: the generation you saw is a whole number from 1")
    fields = [coordinate(n, v) for n, v in (("local_object", local_object),
                                            ("local_id", local_id),
                                            ("remote_object", remote_object),
                                            ("remote_id", remote_id))]
    scope = await _scope(store, settings, binding_id)
    try:
        return await store.link_bind(scope, *fields, expected_generation=expected_generation,
                                     actor=operator.name, role=operator.role, reason=text,
                                     now_us=clock.now_us())
    except BadCoordinate as exc:
        raise BadRequest(f"invalid_input: {exc}") from None


async def show_link(store: WorkStore, settings: Settings, *, actor: str, binding_id: str,
                    local_object: str, local_id: str) -> RemoteLink | None:
    authorize(settings, actor, "link.read")
    scope = await _scope(store, settings, binding_id)
    try:
        return await store.link_get(scope, coordinate("local_object", local_object),
                                    coordinate("local_id", local_id))
    except BadCoordinate as exc:
        raise BadRequest(f"invalid_input: {exc}") from None


def link_json(link: RemoteLink | None) -> dict[str, Any] | None:
    if link is None:
        return None
    return {"link_key": link.link_key, "local_object": link.local_object,
            "local_id": link.local_id, "state": link.state.value,
            "generation": link.generation, "remote_object": link.remote_object,
            "remote_id": link.remote_id}


def bound_json(bound: LinkBound) -> dict[str, Any]:
    return {"outcome": bound.outcome.value, "link": link_json(bound.link),
            "before": link_json(bound.before)}
