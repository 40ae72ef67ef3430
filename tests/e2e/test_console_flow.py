"""The overview's effect path over real HTTP: Lead title changes flow through the HubSpot
simulator and the reference Runtime, and the console shows the rates and the end-to-end
latency, /metrics the receipt deliveries."""

from __future__ import annotations

import re
from typing import Any

import httpx

from storage.effect_values import ReceiptState
from storage.work_store import WorkStore
from tests.admin.support import PASSWORDS, csrf_from, operators
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import running_slice

LEADS = 4


async def _signed_in(base: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base, timeout=10)
    form = await client.get("/admin/sign-in")
    response = await client.post("/admin/sign-in", data={
        "name": "viv", "password": PASSWORDS["viv"], "csrf_token": csrf_from(form.text)})
    assert response.status_code == 302, response.text
    return client


async def test_overview_shows_effect_rates_and_end_to_end_latency(
        database: FreshDatabase, store: WorkStore) -> None:
    async with running_slice(store, database.url, operators=operators()) as sl:
        command_ids = []
        for i in range(LEADS):
            await sl.lead(f"lead-{i}", f"10{i}")
            intent_id = await sl.set_title(f"lead-{i}", f"CTO {i}")
            intent = await sl.wait_intent(f"lead-{i}", intent_id, "COMMITTED")
            command_ids.append(str(intent["command_id"]))

        async def confirmed() -> bool:
            receipts = [await store.receipt_get(c) for c in command_ids]
            return all(r is not None and r.state is ReceiptState.CONFIRMED for r in receipts)

        await wait_for(confirmed, within_s=60)
        client = await _signed_in(sl.base_url)
        try:
            doc: dict[str, Any] = {}

            async def sampled() -> bool:
                nonlocal doc
                doc = (await client.get("/admin/api/overview")).json()
                return bool(doc["flow"]["latency"]["samples"] >= LEADS)

            await wait_for(sampled, within_s=30)
            flow = doc["flow"]
            assert flow["accepted_per_s"] > 0
            assert flow["effects_per_s"]["ACCEPTED"] > 0
            assert flow["receipts_per_s"] > 0
            lat = flow["latency"]
            # Every latency is measured from acceptance: the receipt comes after the answer.
            assert 0 < lat["response_p50_ms"] <= lat["receipt_p50_ms"]
            assert lat["response_p50_ms"] <= lat["response_p99_ms"]
            assert lat["receipt_p50_ms"] <= lat["receipt_p99_ms"] < 60_000
            families = {f["family"]: f for f in doc["families"]}
            assert {"external_effect", "runtime_receipt"} <= set(families)
            assert families["external_effect"]["per_s_window"]["succeeded"] > 0

            charts = await client.get("/admin/overview/live")
            assert charts.status_code == 200
            html = charts.text
            assert 'id="chart-flow"' in html and 'id="chart-latency"' in html
            assert re.search(r'data-series="receipts confirmed"', html)
            assert re.search(r'<li data-series="receipt p99">.*?<b class="figure">[0-9.,]+ ms'
                             r"</b>", html, re.DOTALL)
            assert 'id="chart-depth-external_effect"' in html

            metrics = (await client.get("/metrics")).text
            found = re.search(r'^integrationd_receipt_deliveries_total\{result="confirmed"\} '
                              r"([0-9.]+)$", metrics, re.MULTILINE)
            assert found is not None and float(found.group(1)) == LEADS
            assert "_created" not in metrics
        finally:
            await client.aclose()
