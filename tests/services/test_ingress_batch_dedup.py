"""Batch redeliveries through a real replica's real listener on loopback, on every backend.

HubSpot delivers a JSON array of events and retries a delivery that did not get a 2xx;
each event of the retried batch carries its ``attemptNumber`` incremented, so the raw
body (and its hash) differs from the first attempt. The finding (issue 10, item 3): that
redelivery became a second receipt whose events were materialized again. A batch
receipt is now identified by its events' L1 identities, and events are unique per route,
subscription generation and identity, so a pure redelivery is a duplicate (200, counted,
nothing created) and a re-batched delivery creates only the events not seen before.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from config.catalog import load_catalog
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from daemon.services.replica import Replica
from storage.ingress.receipts import NormalizedEvent, ReceiptQuery
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.webhooks import (
    HUBSPOT_SECRET,
    eventually,
    hubspot_event,
    ingress_replica,
    ingress_settings,
    post,
    sign,
)

HUBSPOT = load_catalog(ingress_settings(Path("/nonexistent"))).webhooks[
    "hubspot.contact_events"]
PUBLIC_URI = "https://hooks.example/hooks/hubspot-main"


async def deliver(client: httpx.AsyncClient, replica: Replica,
                  events: list[dict[str, Any]]) -> httpx.Response:
    """Sign and send one batch the way HubSpot does (each attempt is signed anew)."""
    body = json.dumps(events).encode()
    headers = sign(HUBSPOT, HUBSPOT_SECRET, body, uri=PUBLIC_URI,
                   timestamp_ms=time.time_ns() // 1_000_000)
    return await post(client, replica, "hubspot-main", body, headers, "application/json")


async def all_events(store: WorkStore) -> list[NormalizedEvent]:
    receipts = await store.ingress_receipt_list(ReceiptQuery(limit=500))
    return [e for r in receipts for e in await store.ingress_events_of(r.receipt_id)]


async def settled(store: WorkStore) -> bool:
    receipts = await store.ingress_receipt_list(ReceiptQuery(limit=500))
    return bool(receipts) and all(r.state != "received" for r in receipts)


async def test_a_redelivered_batch_with_attempt_number_plus_one_is_one_delivery(
        store: WorkStore, tmp_path: Path) -> None:
    first = [hubspot_event(1001, 101), hubspot_event(1002, 102)]
    retried = [{**e, "attemptNumber": e["attemptNumber"] + 1} for e in first]
    async with ingress_replica(store, ingress_settings(tmp_path)) as replica, \
            httpx.AsyncClient() as client:
        answer = await deliver(client, replica, first)
        assert (answer.status_code, answer.json()["code"]) == (200, "stored")
        await eventually(lambda: settled(store))
        again = await deliver(client, replica, retried)
        await eventually(lambda: settled(store))

        events = await all_events(store)
        assert sorted(e.resource_id for e in events) == ["101", "102"]
        items = await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))
        assert sorted(i.work_id for i in items) == sorted(e.work_id for e in events)
        assert (again.status_code, again.json()["code"]) == (200, "duplicate")
        assert replica.metrics.ingress_deliveries.labels("duplicate")._value.get() == 1
    (receipt,) = await store.ingress_receipt_list(ReceiptQuery())
    assert receipt.duplicates == 1 and receipt.state == "materialized"


async def test_a_rebatched_delivery_creates_only_the_events_not_seen_before(
        store: WorkStore, tmp_path: Path) -> None:
    async with ingress_replica(store, ingress_settings(tmp_path)) as replica, \
            httpx.AsyncClient() as client:
        answer = await deliver(client, replica, [hubspot_event(1, 101),
                                                 hubspot_event(2, 102)])
        assert answer.json()["code"] == "stored"
        await eventually(lambda: settled(store))
        # Event 2 again (its next attempt) together with a new event 3.
        answer = await deliver(client, replica, [hubspot_event(2, 102, attempt=1),
                                                 hubspot_event(3, 103)])
        assert answer.json()["code"] == "stored"
        await eventually(lambda: settled(store))

        events = await all_events(store)
        assert sorted(e.resource_id for e in events) == ["101", "102", "103"]
        assert len(await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY))) == 3
        # The overlap is counted, visibly: on the metric and on the second receipt.
        assert replica.metrics.ingress_duplicate_events._value.get() == 1
        newest, oldest = await store.ingress_receipt_list(ReceiptQuery())
        assert (newest.duplicate_events, oldest.duplicate_events) == (1, 0)
        assert [e.resource_id for e in await store.ingress_events_of(newest.receipt_id)] == [
            "103"]


async def test_a_batch_event_without_its_identity_is_kept_and_quarantined(
        store: WorkStore, tmp_path: Path) -> None:
    """Without an event id nothing can tell its redelivery apart from a new event: the
    receipt is kept (its key falls back to the raw body) and quarantined, never guessed."""
    nameless = hubspot_event(2, 102)
    del nameless["eventId"]
    async with ingress_replica(store, ingress_settings(tmp_path)) as replica, \
            httpx.AsyncClient() as client:
        answer = await deliver(client, replica, [hubspot_event(1, 101), nameless])
        assert (answer.status_code, answer.json()["code"]) == (200, "stored")
        await eventually(lambda: settled(store))
        (receipt,) = await store.ingress_receipt_list(ReceiptQuery())
        assert (receipt.state, receipt.quarantine_reason) == ("quarantined", "missing_field")
        assert receipt.quarantine_detail == "event 1: no event identity at /eventId"
        assert await all_events(store) == []
        assert replica.metrics.ingress_quarantined.labels("missing_field")._value.get() == 1
