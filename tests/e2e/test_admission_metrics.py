"""Command admission counters, over real HTTP on the assembled /v1/ app and its /metrics."""

from __future__ import annotations

import re

import httpx
import trio

from config.catalog import load_catalog
from daemon.services.assembly import assemble
from daemon.services.catalog_view import publish_current
from daemon.services.clock import WallClock
from daemon.services.http_server import serve_app
from daemon.services.metrics import Metrics
from storage.work_store import WorkStore
from tests.e2e.test_service_api import body
from tests.support.backends import FreshDatabase
from tests.support.slice import RUNTIME_TOKEN, slice_settings


def _count(text: str, request: str, result: str) -> float:
    found = re.search(rf'^integrationd_command_admissions_total\{{request="{request}",'
                      rf'result="{result}"\}} ([0-9.]+)$', text, re.MULTILINE)
    assert found is not None, (request, result)
    return float(found.group(1))


async def test_every_answered_admission_is_counted_by_request_and_result(
        database: FreshDatabase, store: WorkStore) -> None:
    settings = slice_settings(api_port=0, runtime_url="http://127.0.0.1:9",
                              hubspot_url="http://127.0.0.1:9", url=database.url)
    metrics = Metrics()
    # Admission validates against the published revision the command names.
    await publish_current(store, load_catalog(settings), actor="test", role="admin",
                          reason="test setup", now_us=WallClock().now_us())
    parts = assemble(settings, store, WallClock(), metrics)
    assert parts.api_app is not None
    auth = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_app, parts.api_app, "127.0.0.1:0")
        async with httpx.AsyncClient(base_url=address, headers=auth) as client:
            assert (await client.post("/v1/commands", json=body())).status_code == 200
            assert (await client.post("/v1/commands", json=body())).status_code == 200
            conflict = await client.post("/v1/commands", json=body(title="CEO"))
            assert conflict.json()["error"] == "quarantined"
            other = body("int-2")
            handoff = {k: other[k] for k in ("effect_handoff_key", "payload_digest",
                                             "runtime_outbox_id")}
            assert (await client.post("/v1/handoffs/reject", json=handoff)).status_code == 200
            assert (await client.post("/v1/handoffs/reject", json=handoff)).status_code == 200
            late = await client.post("/v1/commands", json=other)
            assert late.json()["admission"] == "HANDOFF_REJECTED"
            # Refused before admission (bad token, bad body): nothing admitted, not counted.
            await client.post("/v1/commands", json=body(), headers={"Authorization": "x"})
            await client.post("/v1/commands", json={"effect_handoff_key": "nope"})
        nursery.cancel_scope.cancel()
    await parts.aclose()
    text = metrics.render().decode()
    assert _count(text, "command", "accepted") == 1
    assert _count(text, "command", "already_accepted") == 1
    assert _count(text, "command", "quarantined") == 1
    assert _count(text, "command", "already_rejected") == 1
    assert _count(text, "reject", "rejected") == 1
    assert _count(text, "reject", "already_rejected") == 1
    total = sum(float(v) for v in re.findall(
        r"^integrationd_command_admissions_total\{[^}]*\} ([0-9.]+)$", text, re.MULTILINE))
    assert total == 6
