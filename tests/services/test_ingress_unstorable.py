"""Issue 21, item 1: a delivery the database can never store is refused before its 200,
and a spooled record it can never store does not stop the forwarder.

Before: the receipt's INSERT failed, ingress took that for a database that is away, put
the receipt in the spool and answered 200; the forwarder then failed on that record every
second, forever, and every record spooled after it waited behind it. A real store on every
backend with its statement limit lowered to 100,000 bytes (the receipt's body is stored as
base64: 4/3 of it), the ingress app itself (no listener) and a real spool directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from config.catalog import load_catalog
from daemon.services.clock import WallClock
from daemon.services.ingress import IngressApp, bind_routes
from daemon.services.ingress_spool import IngressSpool, SpoolForwarder, decode_records
from daemon.services.metrics import Metrics
from storage.ingress.receipts import IngressReceipt, ReceiptQuery
from tests.support.backends import FreshDatabase
from tests.support.ingress import receipt
from tests.support.webhooks import OUTREACH_SECRET, ingress_settings, prospect_body, sign
from tests.support.work import T0

LIMIT = 100_000


async def test_a_receipt_larger_than_a_statement_is_refused_413_not_spooled(
        database: FreshDatabase, tmp_path: Path) -> None:
    store = await database.open_store(max_statement_bytes=LIMIT)
    cfg = ingress_settings(tmp_path)
    catalog = load_catalog(cfg)
    spool = IngressSpool(tmp_path / "spool", 10**7)
    spool.open()
    metrics = Metrics()
    app = IngressApp(settings=cfg.ingress, routes=bind_routes(cfg.webhook_routes,
                                                              catalog.webhooks),
                     clock=WallClock(), insert=store.ingress_receipt_insert, spool=spool,
                     metrics=metrics)
    sent: list[dict[str, Any]] = []

    async def deliver(body: bytes) -> int:
        headers = {"content-type": "application/vnd.api+json",
                   **sign(catalog.webhooks["outreach.prospect_events"], OUTREACH_SECRET,
                          body)}
        scope = {"type": "http", "method": "POST", "path": "/hooks/outreach-main",
                 "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        sent.clear()
        await app(scope, receive, send)
        return int(sent[0]["status"])

    large = prospect_body(pid=1, title="x" * 80_000)   # 80 KB: 107 KB as base64
    assert await deliver(large) == 413
    assert json.loads(sent[1]["body"]) == {"code": "too_large",
                                           "message": "the body is too large to be stored"}
    assert spool.depth == 0 and spool.segments() == []
    assert await store.ingress_receipt_list(ReceiptQuery()) == []
    assert ('integrationd_ingress_rejections_total{reason="too_large_to_store"} 1.0'
            in metrics.render().decode())
    # The database answered: the next delivery goes to it, not to the spool.
    assert await deliver(prospect_body(pid=2)) == 200
    assert json.loads(sent[1]["body"])["code"] == "stored"


def _outreach(n: int, body: bytes) -> IngressReceipt:
    return attrs.evolve(receipt(n, body=body), via="spool")


async def test_a_spooled_record_the_database_refuses_is_held_and_the_rest_forwarded(
        database: FreshDatabase, tmp_path: Path) -> None:
    store = await database.open_store(max_statement_bytes=LIMIT)
    spool = IngressSpool(tmp_path / "spool", 10**7)
    spool.open()
    first, unstorable, after = (_outreach(1, b"{}"), _outreach(2, b"y" * 90_000),
                                _outreach(3, b"{}"))
    await spool.append(first, T0)
    await spool.append(unstorable, T0)
    await spool.seal()
    await spool.append(after, T0)   # a later segment
    forwarder = SpoolForwarder(spool, lambda r: store.ingress_receipt_insert(r, T0))

    assert await forwarder.forward_once() == 3

    stored = {r.receipt_id for r in await store.ingress_receipt_list(ReceiptQuery())}
    assert stored == {first.receipt_id, after.receipt_id}
    assert spool.segments() == [] and spool.depth == 0
    (held,) = (tmp_path / "spool").glob("*.held")
    # Kept whole on disk (answered 200: never deleted), the refused record included.
    kept, _ = decode_records(held.read_bytes())
    assert [(r.receipt_id, r.body) for r in kept] == [
        (first.receipt_id, first.body), (unstorable.receipt_id, unstorable.body)]
