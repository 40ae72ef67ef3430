"""Helpers for the reference Runtime's tests: a fake integrationd and a running Runtime.

``FakeIntegration`` is a real HTTP server (QuartTrio on hypercorn, port 0) that plays
integrationd's ``/v1/commands`` and ``/v1/handoffs/reject`` with the admission rules of seed
000 section 6.1 (one terminal fact per handoff key; a rejection tombstone beats a later
acceptance; a rejection returns an existing acceptance), records every request byte for
byte, and can be scripted (forced answers) or gated (hold a request mid-flight).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio
from quart import request
from quart_trio import QuartTrio

from daemon.core.canonical import canonical_digest
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.retry import BackoffPolicy
from daemon.services.http_server import serve_app
from sandbox.runtime import ReferenceRuntime, serve

SCOPE = TrustedRuntimeWorkScope("org-1", "app-1", "cap-1", canonical_digest({"binding": 1}))
INTEGRATION_TOKEN = "integration-secret-token"
RESULTS_TOKEN = "results-secret-token"
FAST_BACKOFF = BackoffPolicy(base_s=0.01, cap_s=0.05, floor_s=0.005)

Answer = tuple[int, dict[str, Any]]


def _flip(answer: Answer) -> tuple[dict[str, Any], int]:
    return answer[1], answer[0]


@attrs.frozen
class Received:
    path: str
    authorization: str | None
    body: bytes


@attrs.define
class Admission:
    fact: str  # COMMAND_ACCEPTED | HANDOFF_REJECTED
    payload_digest: str
    runtime_outbox_id: str
    command_id: str | None = None


@attrs.define(eq=False)
class FakeIntegration:
    """A stand-in for integrationd's Runtime handoff API (see the module docstring)."""

    token: str = INTEGRATION_TOKEN
    admissions: dict[str, Admission] = attrs.field(factory=dict)
    received: list[Received] = attrs.field(factory=list)
    paths: list[str] = attrs.field(factory=list)
    command_script: list[Answer] = attrs.field(factory=list)
    reject_script: list[Answer] = attrs.field(factory=list)
    hold_before_decision: trio.Event | None = None
    hold_after_decision: trio.Event | None = None
    decided: int = 0
    _next_command: int = 1

    def commands(self) -> list[Received]:
        return [r for r in self.received if r.path == "/v1/commands"]

    def rejects(self) -> list[Received]:
        return [r for r in self.received if r.path == "/v1/handoffs/reject"]

    def _validate(self, doc: dict[str, Any]) -> Answer | Admission | None:
        key = doc["effect_handoff_key"]
        existing = self.admissions.get(key)
        if existing is None:
            return None
        if (existing.payload_digest, existing.runtime_outbox_id) != (
            doc["payload_digest"], doc["runtime_outbox_id"]
        ):
            return 409, {"error": "quarantined", "message": "handoff values differ"}
        return existing

    def _answer(self, admission: Admission, *, rejected_status: int) -> Answer:
        if admission.fact == "COMMAND_ACCEPTED":
            return 200, {"admission": "COMMAND_ACCEPTED", "command_id": admission.command_id}
        receipt = {"version": 1, "effect_handoff_key": "..."}
        return rejected_status, {"admission": "HANDOFF_REJECTED", "receipt": receipt}

    def accept(self, doc: dict[str, Any]) -> Answer:
        found = self._validate(doc)
        if isinstance(found, tuple):
            return found
        if found is None:
            found = Admission("COMMAND_ACCEPTED", doc["payload_digest"],
                              doc["runtime_outbox_id"], f"cmd-{self._next_command}")
            self._next_command += 1
            self.admissions[doc["effect_handoff_key"]] = found
        return self._answer(found, rejected_status=409)

    def reject(self, doc: dict[str, Any]) -> Answer:
        found = self._validate(doc)
        if isinstance(found, tuple):
            return found
        if found is None:
            found = Admission("HANDOFF_REJECTED", doc["payload_digest"], doc["runtime_outbox_id"])
            self.admissions[doc["effect_handoff_key"]] = found
        return self._answer(found, rejected_status=200)

    def create_app(self) -> QuartTrio:
        app = QuartTrio(__name__)

        @app.before_request
        async def note_path() -> None:
            self.paths.append(request.path)  # routes this fake lacks included

        async def record() -> dict[str, Any] | None:
            body = await request.get_data(as_text=False)
            assert isinstance(body, bytes)
            auth = request.headers.get("authorization")
            self.received.append(Received(request.path, auth, body))
            if auth != f"Bearer {self.token}":
                return None
            doc = json.loads(body)
            assert isinstance(doc, dict)
            return doc

        @app.post("/v1/commands")
        async def commands() -> tuple[dict[str, Any], int]:
            doc = await record()
            if doc is None:
                return {"error": "unauthorized"}, 401
            if self.command_script:
                return _flip(self.command_script.pop(0))
            if self.hold_before_decision is not None:
                await self.hold_before_decision.wait()
            answer = self.accept(doc)
            self.decided += 1
            if self.hold_after_decision is not None:
                await self.hold_after_decision.wait()
            return _flip(answer)

        @app.post("/v1/handoffs/reject")
        async def reject() -> tuple[dict[str, Any], int]:
            doc = await record()
            if doc is None:
                return {"error": "unauthorized"}, 401
            if self.reject_script:
                return _flip(self.reject_script.pop(0))
            return _flip(self.reject(doc))

        return app

    async def serve(
        self,
        listen: str = "127.0.0.1:0",
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await serve_app(self.create_app(), listen, graceful_timeout_s=0.1, task_status=task_status)


@asynccontextmanager
async def running_fake(listen: str = "127.0.0.1:0") -> AsyncIterator[tuple[FakeIntegration, str]]:
    fake = FakeIntegration()
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(fake.serve, listen)
        yield fake, url
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class RunningRuntime:
    runtime: ReferenceRuntime
    http: httpx.AsyncClient

    async def create_lead(self, lead_id: str = "lead-1", title: str = "Engineer") -> None:
        response = await self.http.post("/leads", json={"lead_id": lead_id, "title": title})
        assert response.status_code == 201, response.text

    async def patch_title(self, lead_id: str = "lead-1", title: str = "CTO") -> str:
        response = await self.http.patch(f"/leads/{lead_id}", json={"title": title})
        assert response.status_code == 200, response.text
        intent_id = response.json()["intent_id"]
        assert isinstance(intent_id, str)
        return intent_id

    def intent(self, intent_id: str) -> dict[str, Any]:
        return self.runtime.store.intent_view(self.runtime.store.intents[intent_id])

    def status(self, intent_id: str) -> str:
        return self.runtime.store.intents[intent_id].status.value

    async def wait_status(self, intent_id: str, status: str) -> dict[str, Any]:
        await wait_until(lambda: self.status(intent_id) == status)
        return self.intent(intent_id)

    async def post_result(
        self, doc: object, *, token: str | None = RESULTS_TOKEN
    ) -> httpx.Response:
        headers = {"authorization": f"Bearer {token}"} if token is not None else {}
        return await self.http.post("/runtime/v1/results", json=doc, headers=headers)


def runtime_config(integration_url: str, **overrides: Any) -> ReferenceRuntime:
    settings: dict[str, Any] = {
        "scope": SCOPE,
        "integration_url": integration_url,
        "integration_token": INTEGRATION_TOKEN,
        "results_token": RESULTS_TOKEN,
        "catalog_revision": 7,
        "dispatch_backoff": FAST_BACKOFF,
        "poll_interval_s": 0.05,
        "request_timeout_s": 5.0,
        **overrides,
    }
    return ReferenceRuntime(**settings)


@asynccontextmanager
async def running_runtime(integration_url: str, **overrides: Any) -> AsyncIterator[RunningRuntime]:
    runtime = runtime_config(integration_url, **overrides)
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(serve, runtime, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            yield RunningRuntime(runtime, http)
        nursery.cancel_scope.cancel()


async def wait_until(
    predicate: Callable[[], bool], *, limit_s: float = 10.0, interval_s: float = 0.005
) -> None:
    """Poll ``predicate``; the limit only keeps a broken test from hanging."""
    with trio.fail_after(limit_s):
        while True:
            if predicate():
                return
            await trio.sleep(interval_s)


def result_request(intent: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """A valid format-1 ``CommitResultRequest`` for an accepted intent view."""
    doc: dict[str, Any] = {
        "scope": SCOPE.as_json(),
        "intent_id": intent["intent_id"],
        "command_id": intent["command_id"],
        "payload_digest": intent["payload_digest"],
        "catalog_revision": intent["catalog_revision"],
        "result_format_version": 1,
        "remote_id": "123",
        "canonical_result": "",
        "result_digest": "",
    }
    doc.update(overrides)
    return doc
