"""The console's Ingress page and API: receipts with their states and quarantine reasons,
one receipt with its events and work item, the spool of this replica, the lineage section
on an inbound_apply item; no body, signature or secret is ever shown; a bad filter is a
clear 400."""

from __future__ import annotations

import json

import attrs
import pytest

import storage.ingress.receipts
from admin_ui.app import create_app
from admin_ui.extensions import combine
from admin_ui.ingress import ingress_extensions
from storage.ingress.receipts import QuarantineParams
from tests.admin.support import ConsoleHarness
from tests.support.ingress import materialization, receipt
from tests.support.webhooks import OUTREACH_SECRET, ingress_settings
from tests.support.work import T0

SECRET_BODY = b'{"very": "private payload"}'


async def _seed(console: ConsoleHarness) -> tuple[str, str, str]:
    good, bad = receipt(1, body=SECRET_BODY), receipt(2, body=b"{broken")
    for r in (good, bad):
        await console.store.ingress_receipt_insert(r, T0)
    plan = materialization(good)
    await console.store.ingress_materialize(plan, T0)
    await console.store.ingress_quarantine(QuarantineParams(
        receipt_id=bad.receipt_id, reason="malformed", detail="the body is not valid JSON"),
        T0)
    (event,) = await console.store.ingress_events_of(good.receipt_id)
    return good.receipt_id, bad.receipt_id, event.work_id


def _with_ingress(console: ConsoleHarness, tmp_path: object) -> None:
    routes = ingress_settings(tmp_path).webhook_routes  # type: ignore[arg-type]
    console.replica.settings = attrs.evolve(console.replica.settings, webhook_routes=routes)
    console.replica.metrics.set_spool(2, 1_800_000_000_000_000)
    console.app = create_app(console.replica, combine(ingress_extensions()))


async def test_ingress_page_and_api_show_receipts_reasons_and_spool(
        console: ConsoleHarness, tmp_path: object) -> None:
    _with_ingress(console, tmp_path)
    good, bad, work_id = await _seed(console)
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/ingress")).get_json()
    assert doc["counts"] == {"received": 0, "materialized": 1, "quarantined": 1}
    assert doc["spool"]["depth"] == 2 and doc["spool"]["oldest_received"].startswith("2027")
    assert [r["route"] for r in doc["routes"]] == ["outreach-main", "hubspot-main"]
    assert {r["receipt_id"]: r["quarantine_reason"] for r in doc["items"]} == {
        good: None, bad: "malformed"}
    quarantined = await (await client.get("/admin/api/ingress?state=quarantined")).get_json()
    assert [r["receipt_id"] for r in quarantined["items"]] == [bad]
    one = await (await client.get(f"/admin/api/ingress/{good}")).get_json()
    assert [e["work_id"] for e in one["events"]] == [work_id]
    assert one["events"][0]["attributes"] == ["a"]

    page = await (await client.get("/admin/ingress")).get_data(as_text=True)
    assert "the body is not valid JSON" in page and 'id="spool-depth">2<' in page
    detail = await (await client.get(f"/admin/ingress/{good}")).get_data(as_text=True)
    assert work_id in detail
    work = await (await client.get(f"/admin/api/work/{work_id}")).get_json()
    (section,) = [s for s in work["sections"] if s["key"] == "receipts"]
    assert any(row["value"] == good for row in section["rows"])

    everything = json.dumps([doc, one, work]) + page + detail
    for secret in ("private payload", OUTREACH_SECRET, "{broken"):
        assert secret not in everything


async def test_totals_past_their_cap_say_more_than_and_what_was_sampled(
        console: ConsoleHarness, tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23: the totals counted every receipt per view (3.1 s at 500,000 receipts).
    A state's count stops at its cap and says "more than"; duplicates and reasons are of
    the newest receipts, and the headings say so."""
    _with_ingress(console, tmp_path)
    await _seed(console)
    extra = receipt(3, body=b"{also broken")
    await console.store.ingress_receipt_insert(extra, T0)
    await console.store.ingress_quarantine(QuarantineParams(
        receipt_id=extra.receipt_id, reason="malformed", detail="x"), T0)
    client, _ = await console.sign_in("viv")
    page = await (await client.get("/admin/ingress")).get_data(as_text=True)
    assert "Duplicates</th>" in page and "among the newest" not in page
    monkeypatch.setattr(storage.ingress.receipts, "COUNT_CAP", 1)
    monkeypatch.setattr(storage.ingress.receipts, "SAMPLE", 1)
    doc = await (await client.get("/admin/api/ingress")).get_json()
    assert doc["counts"] == {"received": 0, "materialized": 1, "quarantined": 1}
    assert doc["more"] == ["quarantined"] and doc["counted_up_to"] == 1
    assert doc["count_text"] == {"received": "0", "materialized": "1",
                                 "quarantined": "more than 1"}
    assert doc["duplicates_of_newest"] == 1 and doc["reasons_of_newest"] == 1
    page = await (await client.get("/admin/ingress")).get_data(as_text=True)
    assert '<td class="num">more than 1</td>' in page
    assert "Duplicates (newest 1)</th>" in page
    assert "Quarantined receipts by reason, among the newest 1 (" in page


async def test_bad_filters_and_unknown_receipts_are_clear(console: ConsoleHarness,
                                                          tmp_path: object) -> None:
    _with_ingress(console, tmp_path)
    client, _ = await console.sign_in("viv")
    answer = await client.get("/admin/api/ingress?state=lost")
    assert answer.status_code == 400
    assert "state: expected one of" in (await answer.get_json())["message"]
    missing = await client.get("/admin/api/ingress/NOPE")
    assert missing.status_code == 404
    assert (await client.get("/admin/ingress?state=lost")).status_code == 400


async def test_a_receipt_shows_the_events_an_earlier_receipt_already_brought(
        console: ConsoleHarness, tmp_path: object) -> None:
    _with_ingress(console, tmp_path)
    first, rebatched = receipt(1), receipt(2)
    for r in (first, rebatched):
        await console.store.ingress_receipt_insert(r, T0)
    await console.store.ingress_materialize(materialization(first, identities=["ev:1"]), T0)
    await console.store.ingress_materialize(
        materialization(rebatched, identities=["ev:1", "ev:2"]), T0)
    client, _ = await console.sign_in("viv")
    one = await (await client.get(f"/admin/api/ingress/{rebatched.receipt_id}")).get_json()
    assert one["duplicate_events"] == 1 and len(one["events"]) == 1
    detail = await (await client.get(f"/admin/ingress/{rebatched.receipt_id}")).get_data(
        as_text=True)
    assert 'id="duplicate-events">1 ' in detail
    plain = await (await client.get(f"/admin/ingress/{first.receipt_id}")).get_data(
        as_text=True)
    assert "duplicate-events" not in plain


async def test_the_page_says_what_is_not_settled_and_why(console: ConsoleHarness,
                                                         tmp_path: object) -> None:
    """Issue 21, item 1: receipts the materializer could not settle on its latest pass
    (by why) and quarantined receipts by reason, each with what it means; before, a stall
    showed only as a growing 'received' count, and the generic database alert."""
    _with_ingress(console, tmp_path)
    big = receipt(3)
    await console.store.ingress_receipt_insert(big, T0)
    await console.store.ingress_quarantine(QuarantineParams(
        receipt_id=big.receipt_id, reason="too_large_to_store",
        detail="one of its rows (its events and WorkItems) is larger than the database takes"
               " in one statement (16776192 bytes: the server's max_allowed_packet)"), T0)
    console.replica.metrics.ingress_unsettled.labels("database_unavailable").set(4)
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/ingress")).get_json()
    assert doc["settlement"] == {
        "replica_id": console.replica.replica_id,
        "unsettled": [{"reason": "database_unavailable", "receipts": 4,
                       "sentence": "the database did not answer (they are settled once it"
                                   " does)"}],
        "quarantined": [{"reason": "too_large_to_store", "receipts": 1,
                         "sentence": "one of its rows is larger than the database takes in"
                                     " one statement (max_allowed_packet)"}]}
    page = await (await client.get("/admin/ingress")).get_data(as_text=True)
    assert 'id="ingress-unsettled"' in page
    assert "<code>database_unavailable</code></td><td class=\"num\">4<" in page
    assert "<code>too_large_to_store</code></td><td class=\"num\">1<" in page
