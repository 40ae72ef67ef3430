"""The ingress ASGI app on its own (a real store on every backend, no listener): a client
gone before its answer leaves the receipt durable and raises nothing into the server; after
the database failed, receipts go to the spool without waiting for it, until one probes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from config.catalog import load_catalog
from daemon.services.clock import TrioClock, WallClock
from daemon.services.ingress import DB_SUSPECT_S, IngressApp, bind_routes
from daemon.services.ingress_spool import IngressSpool
from daemon.services.metrics import Metrics
from storage.ingress.receipts import ReceiptQuery
from storage.work_store import WorkStore
from tests.support.harness import SwitchableDatabase
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


async def test_after_the_database_failed_receipts_skip_it_then_one_probes(
        store: WorkStore, tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    """Trio's clock stands still here (no autojump) and moves only when the test says."""

    tried: list[str] = []

    class Counting(SwitchableDatabase):
        async def transact(self, body: Any, *, name: str, write: bool = True) -> Any:
            tried.append(name)
            return await super().transact(body, name=name, write=write)

    switch = Counting(store.db)
    switched = WorkStore(switch, store.dialect)
    cfg = ingress_settings(tmp_path)
    catalog = load_catalog(cfg)
    spool = IngressSpool(tmp_path / "spool", 10**6)
    spool.open()
    app = IngressApp(settings=cfg.ingress, routes=bind_routes(cfg.webhook_routes,
                                                              catalog.webhooks),
                     clock=TrioClock(), insert=switched.ingress_receipt_insert, spool=spool,
                     metrics=Metrics())
    webhook = catalog.webhooks["outreach.prospect_events"]
    answers: list[int] = []

    async def deliver(n: int) -> None:
        body = prospect_body(pid=n)
        headers = {"content-type": "application/vnd.api+json",
                   **sign(webhook, OUTREACH_SECRET, body)}
        scope = {"type": "http", "method": "POST", "path": "/hooks/outreach-main",
                 "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answers.append(int(message["status"]))

        await app(scope, receive, send)

    switch.down = True
    for n in range(5):
        await deliver(n)
    assert tried == ["ingress.receipt"]          # one try; the other four went to the spool
    assert answers == [200] * 5 and spool.depth == 5
    mock_clock.jump(DB_SUSPECT_S + 0.1)
    switch.down = False
    await deliver(5)                             # the probe: the database is back
    await deliver(6)
    assert tried.count("ingress.receipt") == 3
    assert len(await store.ingress_receipt_list(ReceiptQuery())) == 2
