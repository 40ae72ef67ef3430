"""Every receipt delivery is counted by result, against a real HTTP Runtime stand-in on
loopback (table-driven over its answers, with the transport and configuration failures)."""

from __future__ import annotations

import json
import re

import attrs
import pytest
import trio
from quart import Response
from quart_trio import QuartTrio

from config.settings import RuntimeClient, Secret, Settings
from daemon.providers.executor import BoundedHttp
from daemon.services.clock import WallClock
from daemon.services.families import WorkContext
from daemon.services.http_server import serve_app
from daemon.services.metrics import RECEIPT_RESULTS, Metrics
from daemon.services.receipt_sender import ReceiptSender
from sandbox.ports import free_port
from storage.effects import RECEIPT_FAMILY
from storage.work_store import WorkStore
from tests.support.work import claim, enqueue

TOKEN = "results-token-0000"


def _runtime(url: str | None) -> RuntimeClient:
    return RuntimeClient(name="crm", org_id="org-1", app_installation_id="i",
                         runtime_capability_id="c", runtime_work_binding_digest="d",
                         results_url=url or "", token=Secret("t"),
                         results_token=Secret(TOKEN) if url else None)


async def _context(store: WorkStore) -> WorkContext:
    payload = json.dumps({"command_id": "cmd-1", "runtime": "crm",
                          "request": {"result_format_version": 2, "intent_id": "i-1"}})
    await enqueue(store, family=RECEIPT_FAMILY, payload=payload)
    (item,) = (await claim(store, family=RECEIPT_FAMILY)).claimed
    assert item.fence is not None
    return WorkContext(item=item, fence=item.fence, store=store, clock=WallClock(),
                       replica_id="test")


def _count(metrics: Metrics, result: str) -> float:
    found = re.search(rf'^integrationd_receipt_deliveries_total\{{result="{result}"\}} '
                      r"([0-9.]+)$", metrics.render().decode(), re.MULTILINE)
    assert found is not None, result
    return float(found.group(1))


@pytest.mark.parametrize(
    ("status", "result"),
    [(200, "confirmed"), (401, "unauthorized"), (403, "unauthorized"), (404, "not_found"),
     (409, "conflict"), (422, "format_refused"), (500, "http_error"), (503, "http_error")],
)
async def test_each_runtime_answer_is_counted_once_by_result(
        store: WorkStore, status: int, result: str) -> None:
    seen: list[str] = []
    app = QuartTrio(__name__)

    @app.post("/results")
    async def results() -> Response:
        from quart import request

        seen.append(request.headers.get("Authorization", ""))
        return Response(json.dumps({"error": "x"} if status != 200 else {}), status=status,
                        content_type="application/json")

    metrics = Metrics()
    client = BoundedHttp.open(2)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_app, app, "127.0.0.1:0")
        base = address if address.startswith("http") else f"http://{address}"
        settings = attrs.evolve(Settings(), runtimes=(_runtime(f"{base}/results"),))
        sender = ReceiptSender(settings=settings, client=client,
                               on_result=metrics.count_receipt)
        await sender.handle(await _context(store))
        nursery.cancel_scope.cancel()
    await client.aclose()
    assert seen == [f"Bearer {TOKEN}"]
    assert _count(metrics, result) == 1
    assert sum(_count(metrics, r) for r in RECEIPT_RESULTS) == 1


@pytest.mark.parametrize(
    ("url", "result"),
    [(None, "not_configured"), ("closed-port", "unreachable")],
)
async def test_a_delivery_that_never_reached_the_runtime_is_counted(
        store: WorkStore, url: str | None, result: str) -> None:
    if url == "closed-port":
        url = f"http://127.0.0.1:{free_port()}/results"  # nothing listens there
    metrics = Metrics()
    client = BoundedHttp.open(2)
    sender = ReceiptSender(settings=attrs.evolve(Settings(), runtimes=(_runtime(url),)),
                           client=client, on_result=metrics.count_receipt, timeout_s=5.0)
    await sender.handle(await _context(store))
    await client.aclose()
    assert _count(metrics, result) == 1
    assert sum(_count(metrics, r) for r in RECEIPT_RESULTS) == 1
