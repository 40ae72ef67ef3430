"""Hypothesis against ingress and the materializer, on every backend: no request crashes
the app, every answer is one of the documented statuses, a 200 always has its whole
receipt, and every receipt is settled (materialized or quarantined) without an error."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config.catalog import load_catalog
from daemon.core.ingress import dedup_key, normalize
from daemon.core.webhook_signature import verify
from daemon.services.clock import WallClock
from daemon.services.ingress import IngressApp, bind_routes
from daemon.services.ingress_spool import IngressSpool
from daemon.services.materializer import Materializer
from daemon.services.metrics import Metrics
from storage.ingress.receipts import ReceiptQuery
from storage.work_store import WorkStore
from tests.support.webhooks import HUBSPOT_SECRET, OUTREACH_SECRET, ingress_settings, sign

WEBHOOKS = load_catalog(ingress_settings(Path("/nonexistent"))).webhooks
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20,
)
PROSPECTISH = st.fixed_dictionaries({
    "data": st.fixed_dictionaries({
        "type": st.sampled_from(["prospect", "", 7]),
        "id": st.one_of(st.integers(-5, 10**12), st.text(max_size=5), st.booleans()),
        "attributes": st.one_of(st.dictionaries(st.text(max_size=6), JSON, max_size=3), JSON),
    }),
    "meta": st.fixed_dictionaries({
        "eventName": st.sampled_from(["prospect.created", "prospect.updated",
                                      "prospect.destroyed", "prospect.merged", ""]),
        "deliveredAt": st.one_of(st.text(max_size=30), st.integers()),
    }),
})
# HubSpot-like batches over a small domain of event identities, so that redeliveries
# (attemptNumber changed), re-batched overlaps and events without an identity occur.
HUBSPOTISH_EVENT = st.fixed_dictionaries({
    "subscriptionType": st.sampled_from(["contact.creation", "contact.propertyChange",
                                         "contact.deletion", "deal.creation"]),
    "objectId": st.integers(1, 3), "occurredAt": st.integers(1, 2),
    "attemptNumber": st.integers(0, 9),
}, optional={
    "eventId": st.one_of(st.integers(1, 4), st.sampled_from(["e1", "", None, True])),
    "subscriptionId": st.just(4711), "portalId": st.just(62515),
})
BODIES = st.one_of(
    st.lists(HUBSPOTISH_EVENT, max_size=4).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=600),
    JSON.map(lambda v: json.dumps(v).encode()),
    PROSPECTISH.map(lambda v: json.dumps(v).encode()),
    st.lists(JSON, max_size=5).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 80).map(lambda n: b"[" * n + b"]" * n),
)


async def test_ingress_and_materializer_never_crash_nor_half_write(
        store: WorkStore, tmp_path: Path) -> None:
    cfg = ingress_settings(tmp_path, max_body_bytes=2048)
    catalog = load_catalog(cfg)
    metrics = Metrics()
    spool = IngressSpool(tmp_path / "spool", 10**7)
    spool.open()
    app = IngressApp(settings=cfg.ingress, routes=bind_routes(cfg.webhook_routes,
                                                              catalog.webhooks),
                     clock=WallClock(), insert=store.ingress_receipt_insert, spool=spool,
                     metrics=metrics)
    materializer = Materializer(max_attempts=8, store=store, catalog=catalog,
                                routes={r.route: r for r in cfg.webhook_routes},
                                clock=WallClock(), metrics=metrics)
    hubspot_uri = "https://hooks.example/hooks/hubspot-main"

    async def request(path: str, method: str, headers: dict[str, str],
                      chunks: list[bytes]) -> int:
        messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                    for i, c in enumerate(chunks)] or [{"type": "http.request", "body": b""}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
                 "query_string": b"", "scheme": "http",
                 "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                             for k, v in headers.items()]}
        await app(scope, receive, send)
        return int(sent[0]["status"]) if sent else 0

    async def one(path: str, method: str, content_type: str, body: bytes, signed: bool,
                  splits: int, junk_signature: str) -> None:
        headers = {"content-type": content_type} if content_type else {}
        route = path.rsplit("/", 1)[-1]
        if signed and route == "hubspot-main":
            headers.update(sign(catalog.webhooks["hubspot.contact_events"], HUBSPOT_SECRET,
                                body, uri=hubspot_uri,
                                timestamp_ms=WallClock().now_us() // 1000))
        elif signed:
            headers.update(sign(catalog.webhooks["outreach.prospect_events"],
                                OUTREACH_SECRET, body))
        else:
            headers["outreach-webhook-signature"] = junk_signature
        step = max(1, len(body) // splits)
        chunks = [body[i:i + step] for i in range(0, len(body), step)]
        status = await request(path, method, headers, chunks)
        assert status in (0, 200, 401, 404, 405, 408, 413, 415), status
        if status == 200:
            key_rows = [r for r in await store.ingress_receipt_list(ReceiptQuery(limit=500))
                        if r.body == body]
            assert key_rows, "a 200 without its receipt"
        while await materializer.run_once():
            pass

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
    @given(path=st.sampled_from(["/hooks/outreach-main", "/hooks/hubspot-main", "/hooks/x",
                                 "/hooks/", "/"]),
           method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]),
           content_type=st.sampled_from(["application/vnd.api+json", "application/json",
                                         "application/json; charset=utf-8", "text/plain",
                                         ""]),
           body=BODIES, signed=st.booleans(), splits=st.integers(1, 4),
           junk_signature=st.text(st.characters(codec="latin-1"), max_size=70))
    def fuzz(path: str, method: str, content_type: str, body: bytes, signed: bool,
             splits: int, junk_signature: str) -> None:
        trio.from_thread.run(one, path, method, content_type, body, signed, splits,
                             junk_signature)

    await trio.to_thread.run_sync(fuzz)
    receipts = await store.ingress_receipt_list(ReceiptQuery(limit=500))
    for r in receipts:  # no half receipt: every stored one is whole and settled
        assert hashlib.sha256(r.body).hexdigest() == r.body_sha256
        assert r.state in ("materialized", "quarantined"), r.state
        if r.state == "quarantined":
            assert r.quarantine_reason and r.quarantine_detail
        else:  # its events, or (events an earlier receipt holds) their count
            assert await store.ingress_events_of(r.receipt_id) or r.duplicate_events


@settings(max_examples=400, deadline=None)
@given(body=BODIES, headers=st.dictionaries(
    st.sampled_from(["outreach-webhook-signature", "x-hubspot-signature-v3",
                     "x-hubspot-request-timestamp"]), st.text(max_size=60), max_size=3))
def test_pure_parts_never_raise(body: bytes, headers: dict[str, str]) -> None:
    for webhook in WEBHOOKS.values():
        result = normalize(webhook.payload, body)
        assert isinstance(result, list) or result.reason
        key = dedup_key(webhook.payload, route="r", subscription_generation=1, raw=body,
                        delivery_id="d")
        assert len(key) <= 100
        verdict = verify(webhook.signature, (b"k",), method="POST", uri="u", body=body,
                         headers=headers, now_us=1_800_000_000_000_000)
        assert verdict.ok is False and verdict.reason
