"""The peer for ``bench/effects.py``: the naive effect path a team would otherwise write.

    python -m bench.effects_peer CONFIG.json

One process per replica-equivalent, in one asyncio loop: an HTTP intake for
the Runtime's handoffs (``POST /v1/commands`` and ``/v1/commands/batch``, the
same requests the reference Runtime sends integrationd) that defers one
procrastinate job per command on PostgreSQL (one ``batch_defer`` per request,
like integrationd's one transaction per batch) and answers
``COMMAND_ACCEPTED``; and a procrastinate worker whose job sends the same
sparse PATCH with httpx and then the same ``CommitResultRequest`` receipt POST.

What it leaves out is the point of the comparison: no admission fence (no
handoff-key uniqueness, digest or scope check), no command or attempt
journal, no dispatch checkpoint, no lease fence, no outcome classification or
reconciliation, no durable receipt: a job that meets a network error (a lost PATCH
answer, a refused receipt) is retried whole, as a naive team's would be, so it
PATCHes again (``bench/effects.py`` counts those duplicate PATCHes). The remote
id comes from memory (``contact_base`` plus the Lead's number, the same mapping
integrationd's seeded links hold), where integrationd reads its RemoteLink: an
advantage to the peer. Every
worker takes any process's jobs from the one queue (as every integrationd
replica takes any item), and a job names the Runtime its receipt goes to. The
receipt is retried in the job while the Runtime answers 503
``handoff_answer_pending`` (its batch answer may still be on its way), as
integrationd's receipt item is.

CONFIG.json: ``{"dsn", "port", "concurrency", "provider_url", "provider_token",
"runtimes": [{"token", "results_url", "results_token", "contact_base"}, ...]}``.
The process ends on SIGTERM at once (nothing of its own needs a graceful end),
and when its parent is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any

import httpx
from hypercorn.asyncio import serve
from hypercorn.config import Config
from procrastinate import App, PsycopgConnector, RetryStrategy

from daemon.core.handoff import RESULT_FORMAT_SUCCESS, EffectHandoffKey, commit_result_request

PATCH_PATH = "/crm/v3/objects/contacts/{remote_id}"
RECEIPT_TRIES = 600
# A naive team's retry: any error, the whole job again after a second, a few times.
JOB_RETRY = RetryStrategy(max_attempts=5, wait=1)


def make_app(dsn: str) -> App:
    return App(connector=PsycopgConnector(conninfo=dsn))


class Peer:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.app = make_app(cfg["dsn"])
        limits = httpx.Limits(max_connections=cfg["concurrency"],
                              max_keepalive_connections=cfg["concurrency"])
        self.http = httpx.AsyncClient(limits=limits, timeout=10.0)
        self.task = self.app.task(name="effect", retry=JOB_RETRY)(self.effect)

    # ---- the job: one PATCH, one receipt POST

    async def effect(self, runtime: int, command_id: str, handoff_key: str, intent_id: str,
                     payload_digest: str, catalog_revision: int, remote_id: str,
                     properties: dict[str, str | None]) -> None:
        cfg = self.cfg
        target = cfg["runtimes"][runtime]
        response = await self.http.patch(
            cfg["provider_url"] + PATCH_PATH.format(remote_id=remote_id),
            json={"properties": properties},
            headers={"Authorization": f"Bearer {cfg['provider_token']}"})
        response.raise_for_status()
        receipt = commit_result_request(
            scope=EffectHandoffKey.parse(handoff_key).scope, intent_id=intent_id,
            command_id=command_id, payload_digest=payload_digest,
            catalog_revision=catalog_revision, result_format_version=RESULT_FORMAT_SUCCESS,
            remote_id=remote_id, canonical_result="", result_digest="")
        for _ in range(RECEIPT_TRIES):
            answer = await self.http.post(
                target["results_url"], json=receipt,
                headers={"Authorization": f"Bearer {target['results_token']}"})
            if answer.status_code != 503:
                answer.raise_for_status()
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("the Runtime never took the receipt")

    # ---- the intake: accept and defer

    def _job(self, runtime: int, body: dict[str, Any]) -> dict[str, Any]:
        command = body["command"]
        lead_id = command["logical_target"]["lead_id"]
        base = self.cfg["runtimes"][runtime]["contact_base"]
        return {
            "runtime": runtime,
            "command_id": uuid.uuid4().hex,
            "handoff_key": body["effect_handoff_key"],
            "intent_id": command["intent_id"],
            "payload_digest": body["payload_digest"],
            "catalog_revision": command["catalog_revision"],
            "remote_id": str(base + int(lead_id.rsplit("-", 1)[1])),
            "properties": command["request"]["properties"],
        }

    async def intake(self, runtime: int, path: str, doc: Any) -> tuple[int, Any]:
        bodies = doc["commands"] if path == "/v1/commands/batch" else [doc]
        jobs = [self._job(runtime, b) for b in bodies]
        await self.task.batch_defer_async(*jobs)
        results = [{"status": 200, "admission": "COMMAND_ACCEPTED",
                    "command_id": j["command_id"]} for j in jobs]
        return 200, ({"results": results} if path == "/v1/commands/batch" else results[0])

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        status: int = 404
        doc: Any = {"error": "not_found"}
        if path == "/healthz":
            status, doc = 200, {"ok": True}
        elif scope["method"] == "POST" and path in ("/v1/commands", "/v1/commands/batch"):
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            runtime = self._caller(dict(scope["headers"]).get(b"authorization", b""))
            if runtime is None:
                status, doc = 401, {"error": "unauthenticated"}
            else:
                status, doc = await self.intake(runtime, path, json.loads(b"".join(chunks)))
        body = json.dumps(doc).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    def _caller(self, header: bytes) -> int | None:
        for index, rt in enumerate(self.cfg["runtimes"]):
            if header == f"Bearer {rt['token']}".encode():
                return index
        return None

    async def run(self) -> None:
        config = Config()
        config.bind = [f"127.0.0.1:{self.cfg['port']}"]
        config.accesslog = None
        config.errorlog = None
        never = asyncio.Event()
        async with self.app.open_async():
            await asyncio.gather(
                # A shutdown trigger of our own: hypercorn then installs no signal
                # handlers, so SIGTERM ends the process.
                serve(self.asgi, config, shutdown_trigger=never.wait),  # type: ignore[arg-type]
                _exit_with_parent(),
                self.app.run_worker_async(concurrency=self.cfg["concurrency"], wait=True,
                                          fetch_job_polling_interval=0.1,
                                          install_signal_handlers=False),
            )


async def _exit_with_parent() -> None:
    parent = os.getppid()
    while True:
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


async def apply_schema(dsn: str) -> None:
    app = make_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        asyncio.run(Peer(json.load(f)).run())
