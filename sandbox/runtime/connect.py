"""The Runtime's connect flows: a user's action -> ``/v1/bindings/...`` -> the user's grant.

:func:`run_flow` prepares the exact request (:meth:`RuntimeStore.prepare_flow`: the
idempotency key is chosen once per action, the expected generation is the one recorded),
sends it, and records the definitive answer. A non-definitive answer (transport error,
5xx, 408/429) is resent with the same bytes a few times, then reported as 503: calling
again resends the same request under the same key, so integrationd applies it once. A
refusal is counted and reported, never resent; after ``stale_generation`` the binding is
read again so the user's next action names the current generation.

The request body may hold the user's tokens: it is sent and dropped, never logged, kept
or echoed (the answer carries the token version, not the token).
"""

from __future__ import annotations

from typing import Protocol

import trio

from daemon.services import logs
from sandbox.runtime.grants import FlowAnswer, FlowRefused, GrantMismatch, UserGrant
from sandbox.runtime.model import RetryLater
from sandbox.runtime.runtime import ReferenceRuntime
from sandbox.runtime.store import Refused

SEND_ATTEMPTS = 3
RESEND_DELAY_S = 0.2


class ConnectPort(Protocol):
    """What the connect flows need from integrationd (tests may substitute it)."""

    async def binding_flow(self, binding_id: str, flow: str,
                           body: bytes) -> FlowAnswer | FlowRefused | RetryLater: ...

    async def binding_read(self, binding_id: str) -> FlowAnswer | FlowRefused | RetryLater: ...


async def run_flow(runtime: ReferenceRuntime, client: ConnectPort, user_id: str,
                   provider: str, flow: str, doc: object) -> UserGrant:
    """Run ``flow`` for the user's ``provider`` grant; raises :class:`Refused` when it
    did not happen (the user's grant record is then unchanged, or marked stale)."""
    store = runtime.store
    prepared = store.prepare_flow(user_id, provider, flow, doc)
    answer: FlowAnswer | FlowRefused | RetryLater = RetryLater("not sent")
    for attempt in range(SEND_ATTEMPTS):
        if attempt:
            await trio.sleep(RESEND_DELAY_S * attempt)
        answer = await client.binding_flow(prepared.binding_id, prepared.flow.value,
                                           prepared.body)
        if not isinstance(answer, RetryLater):
            break
    if isinstance(answer, RetryLater):
        store.counters["flows_unanswered"] += 1
        logs.warn("runtime_flow_unanswered", user_id=user_id, binding_id=prepared.binding_id,
                  flow=prepared.flow.value, reason=answer.reason)
        raise Refused(503, "integration_unavailable", "integrationd gave no definitive"
                      " answer; the grant is unchanged, call again (the same request is"
                      " resent under the same idempotency key)")
    if isinstance(answer, FlowRefused):
        store.record_flow_refusal(user_id, provider, answer)
        logs.warn("runtime_flow_refused", user_id=user_id, binding_id=prepared.binding_id,
                  flow=prepared.flow.value, http_status=answer.http_status,
                  error=answer.error)
        extra: dict[str, object] = {"upstream_status": answer.http_status}
        if answer.error == "stale_generation":
            current = await client.binding_read(prepared.binding_id)
            if isinstance(current, FlowAnswer):
                try:
                    extra["generation"] = store.record_binding_read(
                        user_id, provider, current).generation
                except GrantMismatch as exc:
                    logs.error("runtime_contract_violation", user_id=user_id,
                               binding_id=prepared.binding_id, detail=str(exc))
        raise Refused(409 if answer.http_status == 409 else 502, answer.error,
                      "integrationd refused the connect flow; nothing changed", extra)
    try:
        grant = store.record_flow_answer(user_id, provider, answer)
    except GrantMismatch as exc:
        logs.error("runtime_contract_violation", user_id=user_id,
                   binding_id=prepared.binding_id, detail=str(exc))
        raise Refused(502, "contract_violation", str(exc)) from None
    logs.event("runtime_flow_applied", user_id=user_id, binding_id=grant.binding_id,
               flow=prepared.flow.value, generation=grant.generation,
               state=grant.status.value, token_version=grant.token_version,
               replayed=answer.replayed)
    return grant
