"""The reference Runtime's HTTP surface (QuartTrio) and :func:`serve`.

The handlers are thin: parse JSON, call one synchronous store method (one atomic step) or
the withdraw call, render the answer. Errors are JSON ``{"error": code, "message": text}``.
"""

from __future__ import annotations

import hmac
import json
import urllib.parse
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from config.settings import Secret
from daemon.services.http_guard import guard_app
from daemon.services.http_server import serve_app
from sandbox.runtime.connect import ConnectPort, run_flow
from sandbox.runtime.dispatcher import (
    IntegrationClient,
    IntegrationPort,
    OutboxDispatcher,
    withdraw_intent,
)
from sandbox.runtime.receipts import BadInput, CommitResult, results_batch
from sandbox.runtime.runtime import ReferenceRuntime
from sandbox.runtime.store import Refused

MAX_BODY_BYTES = 64 * 1024
JsonAnswer = tuple[dict[str, Any], int]


def bearer_matches(header: str | None, token: Secret) -> bool:
    """Constant-time check of an ``Authorization: Bearer <token>`` header."""
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        value.strip().encode(), token.reveal().encode()
    )


async def _json_body() -> object:
    data = await request.get_data(as_text=False)
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _MalformedJson(str(exc)) from None


class _MalformedJson(Exception):
    pass


def create_app(runtime: ReferenceRuntime, client: IntegrationPort,
               connect: ConnectPort | None = None) -> QuartTrio:
    """The Runtime's routes over ``runtime``'s store; ``client`` reaches integrationd for
    handoffs, ``connect`` for the connect flows (None: the flows answer 501)."""
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    store = runtime.store

    @app.post("/leads")
    async def create_lead() -> JsonAnswer:
        lead = store.create_lead(await _json_body())
        return store.lead_view(lead.lead_id), 201

    @app.get("/leads/<lead_id>")
    async def get_lead(lead_id: str) -> JsonAnswer:
        return store.lead_view(lead_id), 200

    @app.patch("/leads/<lead_id>")
    async def update_lead(lead_id: str) -> JsonAnswer:
        states = store.update_lead_intents(lead_id, await _json_body())
        runtime.wakeup.set()
        return {
            "intent_id": states[0].intent.intent_id,
            "intent_ids": [s.intent.intent_id for s in states],
            "status": states[0].status.value,
            "lead": store.lead_summary(store.lead(lead_id)),
        }, 200

    @app.post("/users/<user_id>/grants/<provider>/<flow>")
    async def user_flow(user_id: str, provider: str, flow: str) -> JsonAnswer:
        # The CRM's half of connecting an account is done (the OAuth code exchange, an
        # app installation): hand the grant to integrationd and record what it answers.
        if connect is None:
            raise Refused(501, "no_connect_client", "this Runtime cannot run connect flows")
        grant = await run_flow(runtime, connect, user_id, provider, flow, await _json_body())
        return {"grant": grant.view()}, 200

    @app.get("/users/<user_id>")
    async def get_user(user_id: str) -> JsonAnswer:
        return store.user_view(user_id), 200

    @app.delete("/leads/<lead_id>")
    async def delete_lead(lead_id: str) -> Response:
        store.delete_lead(lead_id)
        return Response(b"", status=204)

    @app.post("/leads/<lead_id>/transfer")
    async def transfer(lead_id: str) -> JsonAnswer:
        source, target = store.transfer(lead_id, await _json_body())
        return {"from": store.lead_summary(source), "to": store.lead_summary(target)}, 200

    @app.post("/leads/<lead_id>/intents/<intent_id>/withdraw")
    async def withdraw(lead_id: str, intent_id: str) -> JsonAnswer:
        state = await withdraw_intent(runtime, client, lead_id, intent_id)
        return store.intent_view(state), 200

    @app.post("/runtime/v1/results")
    async def commit_result() -> JsonAnswer | tuple[dict[str, Any], int, dict[str, str]]:
        if not bearer_matches(request.headers.get("authorization"), runtime.results_token):
            return (
                {"error": "unauthorized", "message": "a valid bearer token is required"},
                401,
                {"WWW-Authenticate": "Bearer"},
            )
        decision = store.commit_result(await _json_body())
        return {"status": "COMMITTED" if isinstance(decision, CommitResult) else "DUPLICATE"}, 200

    @app.post("/runtime/v1/results/batch")
    async def commit_results() -> JsonAnswer | tuple[dict[str, Any], int, dict[str, str]]:
        # Many receipts in one request, each judged alone in its own atomic step, exactly as
        # POST /runtime/v1/results would judge it: the answer holds one result per request,
        # in order, with the status and error the single route would have answered.
        refused = _unauthorized()
        if refused is not None:
            return refused
        return {"results": [_one_result(doc)
                            for doc in results_batch(await _json_body())]}, 200

    def _one_result(doc: object) -> dict[str, Any]:
        try:
            decision = store.commit_result(doc)
        except Refused as exc:
            return {"status": exc.http_status, **exc.body()}
        except BadInput as exc:
            return {"status": 400, "error": "bad_request", "message": str(exc)}
        return {"status": 200,
                "result": "COMMITTED" if isinstance(decision, CommitResult) else "DUPLICATE"}

    def _unauthorized() -> tuple[dict[str, Any], int, dict[str, str]] | None:
        if bearer_matches(request.headers.get("authorization"), runtime.results_token):
            return None
        return ({"error": "unauthorized", "message": "a valid bearer token is required"},
                401, {"WWW-Authenticate": "Bearer"})

    @app.post("/runtime/v1/inbound-mutations")
    async def inbound_mutation() -> JsonAnswer | tuple[dict[str, Any], int, dict[str, str]]:
        # integrationd's inbound Flow: change only the named fields of one Lead, once per
        # mutation_key (a resend after a lost answer is a DUPLICATE, never a second change).
        refused = _unauthorized()
        if refused is not None:
            return refused
        status, lead = store.inbound_mutation(await _json_body())
        return {"status": status, "lead_id": lead.lead_id, "fields": dict(lead.fields)}, 200

    @app.get("/runtime/v1/leads")
    async def match_leads() -> JsonAnswer | tuple[dict[str, Any], int, dict[str, str]]:
        refused = _unauthorized()
        if refused is not None:
            return refused
        field, value = request.args.get("field", ""), request.args.get("value")
        if value is None:
            raise BadInput("value is required")
        return {"lead_ids": store.leads_matching(field, value)}, 200

    @app.get("/_runtime/leads/<lead_id>/fields")
    async def lead_fields(lead_id: str) -> JsonAnswer:
        return {"lead_id": lead_id, "fields": dict(store.lead(lead_id).fields)}, 200

    @app.get("/_runtime/intents")
    async def list_intents() -> JsonAnswer:
        return {"intents": store.list_intents(request.args.get("status"))}, 200

    @app.get("/_runtime/stats")
    async def stats() -> JsonAnswer:
        return store.stats(), 200

    @app.get("/healthz")
    async def healthz() -> JsonAnswer:
        return {"status": "ok"}, 200

    @app.errorhandler(Refused)
    async def refused(exc: Refused) -> JsonAnswer:
        return exc.body(), exc.http_status

    @app.errorhandler(BadInput)
    async def bad_input(exc: BadInput) -> JsonAnswer:
        return {"error": "bad_request", "message": str(exc)}, 400

    @app.errorhandler(_MalformedJson)
    async def malformed(exc: _MalformedJson) -> JsonAnswer:
        return {"error": "malformed_json", "message": f"the body is not JSON: {exc}"}, 400

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> JsonAnswer:
        code = exc.code or 500
        names = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
        messages = {
            404: "no such route",
            405: "method not allowed here",
            413: f"the body is larger than {MAX_BODY_BYTES} bytes",
        }
        message = messages.get(code, exc.description or exc.name)
        return {"error": names.get(code, f"http_{code}"), "message": message}, code

    guard_app(app, MAX_BODY_BYTES)  # an early 401 never stalls integrationd's receipt sender
    return app


def _listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def serve(
    runtime: ReferenceRuntime,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the Runtime's HTTP API and run its outbox dispatcher until cancelled.

    ``port`` 0 picks a free port; the bound port is reported through ``task_status``.
    """
    async with IntegrationClient.open(runtime) as client, trio.open_nursery() as nursery:
        await nursery.start(OutboxDispatcher(runtime, client).run)
        bound: str = await nursery.start(serve_app, create_app(runtime, client, client),
                                         _listen(host, port))
        bound_port = urllib.parse.urlsplit(bound).port
        task_status.started(bound_port if bound_port is not None else port)
