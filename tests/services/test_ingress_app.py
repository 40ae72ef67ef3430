"""The ingress ASGI app on its own (a real SQLite store, no listener): a client gone before
its answer leaves the receipt durable and raises nothing into the server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config.catalog import load_catalog
from daemon.services.clock import WallClock
from daemon.services.ingress import IngressApp, bind_routes
from daemon.services.ingress_spool import IngressSpool
from daemon.services.metrics import Metrics
from storage.ingress.receipts import ReceiptQuery
from storage.work_store import WorkStore
from tests.support.webhooks import OUTREACH_SECRET, ingress_settings, prospect_body, sign


async def test_a_client_gone_before_its_answer_keeps_the_receipt(
        store: WorkStore, tmp_path: Path) -> None:
    cfg = ingress_settings(tmp_path)
    catalog = load_catalog(cfg)
    spool = IngressSpool(tmp_path / "spool", 10**6)
    spool.open()
    app = IngressApp(settings=cfg.ingress, routes=bind_routes(cfg.webhook_routes,
                                                              catalog.webhooks),
                     clock=WallClock(), insert=store.ingress_receipt_insert, spool=spool,
                     metrics=Metrics())
    body = prospect_body()
    headers = {"content-type": "application/vnd.api+json",
               **sign(catalog.webhooks["outreach.prospect_events"], OUTREACH_SECRET, body)}
    scope = {"type": "http", "method": "POST", "path": "/hooks/outreach-main",
             "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        raise RuntimeError("Unexpected message type: the connection is closed")

    await app(scope, receive, send)
    (receipt,) = await store.ingress_receipt_list(ReceiptQuery())
    assert receipt.body == body
