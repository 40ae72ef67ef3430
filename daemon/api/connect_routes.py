"""The Runtime's connect flows on the service API (seed 8.1, 8.2).

* ``POST /v1/bindings/{binding_id}/{flow}``: ``connect``, ``disconnect``, ``reconnect``,
  ``change_issuer``, ``reinstall``, ``rebind``, ``change_scopes``
  (:mod:`daemon.core.connect_flows` says what each does);
* ``GET /v1/bindings/{binding_id}``: the binding's current generation and state, for
  the Runtime to name in its next flow.

Authenticated as the rest of ``/v1/``; the binding belongs to the caller's org and app
installation (another scope's binding is "unknown", whatever it is). Idempotent by the
``idempotency_key`` the Runtime chooses; audited with the Runtime as actor. Tokens go
straight into a sealed bundle under the active key: they are never logged, stored in the
clear, or echoed (the answer holds the token version, not the token).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from quart import Response
from quart_trio import QuartTrio

from config.settings import RuntimeClient
from daemon.api.flow_validation import FlowBody, flow_body
from daemon.api.validation import ApiError
from daemon.core.canonical import NotCanonical, canonical_digest
from daemon.core.connect_flows import Flow
from daemon.core.principals import BindingIdentity, BindingRefused, connect
from daemon.core.token_bundle import BundleContext, SealedBundle, TokenKey, seal
from daemon.services import logs
from daemon.services.clock import Clock
from storage.binding_flows import FlowGrant, FlowKeyReused, FlowRequest
from storage.port import WorkConflict
from storage.principals import Actor
from storage.work_store import WorkStore

_BINDING_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
# Refusal reason -> HTTP status (the reason is the stable error code).
_STATUS = {"unknown_binding": 404, "stale_generation": 409, "binding_exists": 409,
           "binding_disconnected": 409, "field_not_allowed": 400, "grant_required": 400,
           "grant_not_allowed": 400, "missing_field": 400, "user_required": 400,
           "user_not_allowed": 400}


def _json(doc: dict[str, Any], status: int) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


def _request_digest(raw: Any) -> str:
    try:
        return canonical_digest(raw)
    except (NotCanonical, TypeError, ValueError):
        raise ApiError(400, "invalid_request", "the body is not canonical JSON") from None


def _grant(body: FlowBody, key: TokenKey | None, now_us: int) -> FlowGrant | None:
    bundle = body.bundle
    if bundle is None:
        return None
    if key is None:
        # The deployment's state, not an outage: no retry helps until an operator
        # configures [keys] active.
        raise ApiError(409, "no_token_keys", "no token key is configured ([keys] active):"
                       " a grant cannot be sealed")
    expires_at_us = now_us + body.expires_in_s * 1_000_000 if body.expires_in_s else 0
    sealed_bundle = attrs.evolve(bundle, expires_at_us=expires_at_us)

    def sealer(context: BundleContext) -> SealedBundle:
        return seal(sealed_bundle, key, context)

    return FlowGrant(seal=sealer, expires_at_us=expires_at_us)


def add_connect_routes(app: QuartTrio, *, store: WorkStore, clock: Clock,
                       token_key: Callable[[], TokenKey | None],
                       caller: Callable[[], RuntimeClient],
                       json_body: Callable[[], Awaitable[Any]]) -> None:
    @app.post("/v1/bindings/<binding_id>/<flow>")
    async def binding_flow(binding_id: str, flow: str) -> Response:
        rc = caller()
        raw = await json_body()
        body = flow_body(flow, raw)
        if not _BINDING_ID.fullmatch(binding_id):
            raise ApiError(400, "invalid_request", "the binding id must be 1 to 128"
                           " letters, digits, '.', '_' or '-'")
        now = clock.now_us()
        new = None
        if body.flow is Flow.CONNECT:
            try:
                new = connect(binding_id=binding_id, kind=body.kind, org_id=rc.org_id,
                              app_installation_id=rc.app_installation_id,
                              provider=body.provider, user_id=body.user_id,
                              identity=BindingIdentity(**{"installation_id": "",
                                                          "scopes": (), **body.identity}))
            except BindingRefused as exc:
                raise ApiError(_STATUS.get(exc.reason, 400), exc.reason, str(exc)) from None
        req = FlowRequest(
            runtime_name=rc.name, idempotency_key=body.idempotency_key,
            request_digest=_request_digest({"binding_id": binding_id, "flow": flow,
                                            "body": raw}),
            org_id=rc.org_id, app_installation_id=rc.app_installation_id,
            binding_id=binding_id, flow=body.flow,
            expected_generation=body.expected_generation,
            changes=() if body.flow is Flow.CONNECT else tuple(sorted(body.identity.items())),
            new=new, grant=_grant(body, token_key(), now),
            actor=Actor(f"runtime:{rc.name}", "runtime", body.reason))
        try:
            result = await store.binding_flow(req, now)
        except BindingRefused as exc:
            raise ApiError(_STATUS.get(exc.reason, 409), exc.reason,
                           str(exc).partition(": ")[2] or exc.reason) from None
        except FlowKeyReused:
            raise ApiError(409, "idempotency_key_reused", "this idempotency key was used"
                           " for another request; choose a new key per request") from None
        except WorkConflict:
            raise ApiError(409, "stale_generation", f"binding {binding_id} changed while"
                           " this request was applied; read it and try again") from None
        answer = result.response
        if not result.replayed:
            logs.event("binding_flow", runtime=rc.name, binding_id=binding_id, flow=flow,
                       generation=answer["generation"], bumped=answer["generation_bumped"],
                       token_version=answer["token_version"])
        return _json({**answer, "replayed": result.replayed}, 200)

    @app.get("/v1/bindings/<binding_id>")
    async def binding_read(binding_id: str) -> Response:
        rc = caller()
        facts = await store.binding_get(binding_id)
        if facts is None or (facts.org_id, facts.app_installation_id) != (
                rc.org_id, rc.app_installation_id):
            raise ApiError(404, "unknown_binding", f"no binding {binding_id[:128]} in this"
                           " scope")
        grant = await store.grant_get(binding_id, facts.generation)
        return _json({"binding_id": facts.binding_id, "kind": facts.kind.value,
                      "provider": facts.provider, "user_id": facts.user_id or None,
                      "generation": facts.generation, "state": facts.state.value,
                      "grant_state": None if grant is None else grant.state.value,
                      "token_version": None if grant is None else grant.token_version}, 200)
