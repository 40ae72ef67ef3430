"""The console's History page and its JSON (issue 23 item 1): drawn from the database,
so a replica that started after the executions finished (a restart, another replica)
shows them; every point links to the executions behind it; whatever range or filter
cannot be parsed is a 400 with a message; the viewer reads it.

Finding: the overview's charts came from samples in one replica's memory, so a replica
started after the work finished showed none of it (its flow and family series were
empty), and there was no history route at all (``/admin/api/history`` answered 404).
"""

from __future__ import annotations

import re

from admin_ui.app import create_app
from admin_ui.extensions import combine
from admin_ui.history import history_extensions
from daemon.services.clock import WallClock
from daemon.services.replica import Replica
from tests.admin.support import ConsoleHarness
from tests.admin.test_openapi import _routes
from tests.support.find import seed_receipts
from tests.support.history import finish_effects, use_quota
from tests.support.work import T0


def _with_history(console: ConsoleHarness) -> None:
    console.app = create_app(console.replica, combine(history_extensions()))


async def test_a_replica_started_later_shows_the_history_and_links_each_point(
        console: ConsoleHarness) -> None:
    dead = await console.dead_items(3, failure_class="boom")
    # Another replica (or this one after a restart) over the same database: it has taken
    # no sample of its own.
    later = Replica(console.replica.settings, console.store, console.replica.registry,
                    WallClock(), replica_id="started-later")
    console.replica = later
    _with_history(console)
    viewer, _ = await console.sign_in("viv")
    doc = await (await viewer.get("/admin/api/history?range=15m")).get_json()
    assert doc["range"] == "15m" and doc["step_us"] == 60_000_000
    assert doc["dlq_inflow"]["total"] == 3
    (point,) = [p for p in doc["dlq_inflow"]["points"] if p["executions"]]
    assert point["executions"] == 3
    items = await (await viewer.get(point["items"].replace("/admin/", "/admin/api/", 1)))\
        .get_json()
    assert sorted(e["work_id"] for e in items["executions"]) == sorted(dead)
    assert {e["outcome"] for e in items["executions"]} == {"dead"}
    # The page draws a link on the point, to the page listing those items.
    html = await (await viewer.get("/admin/history?range=15m")).get_data(as_text=True)
    links = re.findall(r'<a class="point-link" href="([^"]+)" data-series="dead"', html)
    assert links, html
    listing = await (await viewer.get(links[0].replace("&amp;", "&"))).get_data(as_text=True)
    assert all(f'href="/admin/work/{w}"' in listing for w in dead)
    # Per family: another family's history is empty.
    other = await (await viewer.get("/admin/api/history?range=1h&family=other")).get_json()
    assert other["throughput"] == [] and other["dlq_inflow"]["total"] == 0
    assert 'href="/admin/history"' in html  # in the navigation


BAD_RANGES = [
    ("range=2h", "unknown range '2h'"),
    ("range=1h&from=1800000000&to=1800003600", "either range or from and to"),
    ("from=1800000000", "needs both from and to"),
    ("range=custom", "needs both from and to"),
    ("range=custom&to=1800000000", "needs both from and to"),
    ("from=yesterday&to=1800000000", "from must be an ISO 8601 UTC time"),
    ("from=1800003600&to=1800000000", "to must be later than from"),
    ("from=1700000000&to=1800000000", "at most 92 days"),
    ("range=1h&range=6h", "more than once"),
    ("region=eu", "unknown parameter 'region'"),
    ("family=" + "f" * 65, "family is longer than 64"),
    ("org=" + "o" * 129, "org is longer than 128"),
    ("binding=" + "b" * 256, "binding is longer than 255"),
    # The rollups' key columns are 128 wide: a longer value can match nothing.
    ("binding=" + "b" * 129, "binding is longer than 128"),
    ("operation=" + "p" * 129, "operation is longer than 128"),
    ("operation=a%01b", "operation contains control characters"),
    ("org=org-1&org=org-2", "more than once"),
    ("key=" + "k" * 256, "key is longer than 255"),
]
BAD_SLOTS = [
    ("from=1800000000&to=1800000060", "key is required"),
    ("key=k", "from and to are required"),
    ("key=k&from=1800000000&to=1800000060&org=o", "unknown parameter 'org'"),
]
BAD_COMMANDS = [
    ("from=1800000000&to=1800000060", "metric must be one of accepted, receipted"),
    ("metric=dead&from=1800000000&to=1800000060", "metric must be one of"),
    ("metric=accepted", "from and to are required"),
    ("metric=accepted&from=1800000000&to=1800000060&family=noop", "unknown parameter"),
    ("metric=receipted&from=1800000000&to=1800000060&limit=501", "limit must be"),
]
BAD_BUCKETS = [
    ("", "from and to are required"),
    ("from=1800000000&to=1799999999", "to must be later than from"),
    ("from=1800000000&to=1900000000", "at most 7 days"),
    ("from=1800000000&to=1800000060&limit=0", "limit must be a whole number"),
    # The filters of a narrowed point's link (issue 23 item 1: per org, binding, operation).
    ("from=1800000000&to=1800000060&binding=" + "b" * 129, "binding is longer than 128"),
    ("from=1800000000&to=1800000060&org=a&org=b", "more than once"),
    ("from=1800000000&to=1800000060&operation=a%01b", "operation contains control"),
    ("from=1800000000&to=1800000060&key=k", "unknown parameter 'key'"),
]


async def test_the_queue_pressure_is_drawn_from_the_samples_per_family(
        console: ConsoleHarness) -> None:
    """The work queue's ready, waiting and claimed items per family, from the per-minute
    samples any replica wrote (storage/history_pressure.py): a sampled step with nothing
    of the family is 0, a step no replica sampled is null (a gap); a point links to the
    executions of its step, a series to its items now."""
    _with_history(console)
    now = WallClock().now_us()
    await console.enqueue(3)
    await console.enqueue(2, family="other", run_after_us=now + 3_600_000_000)
    assert await console.store.history_pressure_sample(WallClock().now_us()) is not None
    viewer, _ = await console.sign_in("viv")
    doc = await (await viewer.get("/admin/api/history?range=15m&family=noop")).get_json()
    queue = doc["queue_pressure"]
    assert queue["family"] == "noop" and queue["sampled_steps"] == 1
    by = {s["series"]: s for s in queue["series"]}
    assert by["ready"]["latest"] == 3 and by["ready"]["peak"] == 3
    assert by["held"]["peak"] == 0  # sampled: none of noop held
    assert by["ready"]["now"] == "/admin/work?state=pending&family=noop"
    assert [p["n"] for p in by["ready"]["points"]].count(None) == queue["steps"] - 1
    (point,) = [p for p in by["ready"]["points"] if p["n"]]
    assert point["items"].startswith("/admin/history/items?") and "family=noop" in point["items"]
    everyone = await (await viewer.get("/admin/api/history?range=15m")).get_json()
    held = {s["series"]: s for s in everyone["queue_pressure"]["series"]}["held"]
    assert held["peak"] == 2
    html = await (await viewer.get("/admin/history?range=15m&family=noop")).get_data(
        as_text=True)
    assert 'id="chart-history-queue"' in html
    assert re.search(r'<a class="point-link" href="/admin/history/items\?[^"]*family=noop'
                     r'[^"]*" data-series="ready"', html), html
    assert "1 of 15 steps sampled" in html
    assert "Not narrowed by org" not in html
    assert everyone["queue_pressure"]["not_narrowed_by"] == []
    # An org filter narrows the executions, DLQ inflow and effect path, not the queue's
    # samples (per family only): the page and the JSON say so, and why, beside that
    # chart alone instead of showing it unfiltered without a word.
    narrowed = await (await viewer.get("/admin/history?range=15m&org=org-9")).get_data(
        as_text=True)
    assert narrowed.count('class="muted small not-narrowed"') == 1
    assert ('id="queue-not-narrowed">Not narrowed by org: the queue is sampled once a'
            ' minute per family') in narrowed
    two = await (await viewer.get("/admin/api/history?range=15m&org=o&binding=b")).get_json()
    assert two["queue_pressure"]["not_narrowed_by"] == ["org", "binding"]
    assert "work_items_ready" in two["queue_pressure"]["not_narrowed_because"]


async def test_a_range_or_filter_that_cannot_be_parsed_is_a_400_with_a_message(
        console: ConsoleHarness) -> None:
    _with_history(console)
    viewer, _ = await console.sign_in("viv")
    for query, message in BAD_RANGES:
        answer = await viewer.get(f"/admin/api/history?{query}")
        assert answer.status_code == 400, query
        doc = await answer.get_json()
        assert doc["error"] == "bad_filter" and message in doc["message"], query
        shown = await viewer.get(f"/admin/history?{query}")
        assert shown.status_code == 400, query
        assert message.replace("'", "&#39;") in await shown.get_data(as_text=True), query
    for query, message in BAD_BUCKETS:
        for prefix in ("/admin/api", "/admin"):
            answer = await viewer.get(f"{prefix}/history/items?{query}")
            assert answer.status_code == 400, query
        answer = await viewer.get(f"/admin/api/history/items?{query}")
        assert message in (await answer.get_json())["message"], query
    for listing, rows in (("commands", BAD_COMMANDS), ("slots", BAD_SLOTS)):
        for query, message in rows:
            for prefix in ("/admin/api", "/admin"):
                answer = await viewer.get(f"{prefix}/history/{listing}?{query}")
                assert answer.status_code == 400, query
            answer = await viewer.get(f"/admin/api/history/{listing}?{query}")
            assert message in (await answer.get_json())["message"], query


async def test_the_history_routes_are_documented_and_need_a_session(
        console: ConsoleHarness) -> None:
    _with_history(console)
    viewer, _ = await console.sign_in("viv")
    documented = (await (await viewer.get("/admin/api/openapi.json")).get_json())["paths"]
    for path in ("/admin/api/history", "/admin/api/history/items",
                 "/admin/api/history/commands", "/admin/api/history/slots"):
        assert path in documented and (path, "get") in _routes(console)
        assert (await console.client().get(path)).status_code == 401


async def test_pressure_and_latency_per_org_binding_and_operation_link_their_commands(
        console: ConsoleHarness) -> None:
    """The effect path's pressure (commands accepted against receipts confirmed) and
    latency, from the ``history_flow`` rollup, narrowed per org, binding and operation;
    each point links to the commands behind it."""
    seeded = await seed_receipts(console.store, T0)
    _with_history(console)
    viewer, _ = await console.sign_in("viv")
    span = f"from={T0 // 1_000_000 - 60}&to={T0 // 1_000_000 + 240}"
    doc = await (await viewer.get(f"/admin/api/history?{span}")).get_json()
    assert doc["step_us"] == 60_000_000
    accepted, receipted = doc["pressure"]
    assert (accepted["series"], accepted["total"]) == ("commands accepted", 6)
    assert (receipted["series"], receipted["total"]) == ("receipts confirmed", 2)
    assert doc["backlog_change"] == 4
    response, receipt = doc["latency"]["response"], doc["latency"]["receipt"]
    assert response["range"]["count"] == receipt["range"]["count"] == 2
    # Percentiles are the upper bounds of log buckets: never below, at most 9 % above.
    assert 2000 <= response["range"]["p50_ms"] <= 2000 * 1.091
    assert 70_000 <= receipt["range"]["p99_ms"] <= 70_000 * 1.091
    (late,) = [p for p in receipt["points"] if p["count"]][1:]
    behind = await (await viewer.get(late["items"].replace("/admin/", "/admin/api/", 1)))\
        .get_json()
    assert [c["command_id"] for c in behind["commands"]] == [seeded[0].command_id]
    assert behind["commands"][0]["receipt_ms"] == 70_000.0
    (busy,) = [p for p in accepted["points"] if p["count"]]
    listed = await (await viewer.get(busy["items"].replace("/admin/", "/admin/api/", 1)))\
        .get_json()
    assert len(listed["commands"]) == 6
    # Filters: the same for the command's own org, binding and operation; none elsewhere.
    mine = ("org=org-1&binding=hubspot-main"
            "&operation=hubspot.contact.update_jobtitle")
    narrowed = await (await viewer.get(f"/admin/api/history?{span}&{mine}")).get_json()
    assert narrowed["pressure"] == [
        {**s, "points": [{**p, "items": p["items"] + "&" + mine} for p in s["points"]]}
        for s in doc["pressure"]]
    assert narrowed["filters"]["binding"] == "hubspot-main"
    for other in ("org=org-2", "binding=other", "operation=hubspot.deal.create"):
        none = await (await viewer.get(f"/admin/api/history?{span}&{other}")).get_json()
        assert [s["total"] for s in none["pressure"]] == [0, 0], other
        assert none["latency"]["receipt"]["range"]["p50_ms"] is None
    # The page draws both charts with links on their points, and keeps the filters.
    html = await (await viewer.get(f"/admin/history?{span}&org=org-1")).get_data(as_text=True)
    assert 'id="chart-history-pressure"' in html and 'id="chart-history-latency"' in html
    assert 'data-series="commands accepted"' in html and 'data-series="receipt p99"' in html
    assert 'value="org-1"' in html and "4 more accepted than confirmed" in html
    link = re.search(r'<a class="point-link" href="([^"]+)" data-series="receipt p50"',
                     html)
    assert link is not None
    page = await (await viewer.get(link[1].replace("&amp;", "&"))).get_data(as_text=True)
    assert f'href="/admin/effects/commands/{seeded[2].command_id}"' in page


async def test_quota_use_against_the_limit_per_key_links_its_slots(
        console: ConsoleHarness) -> None:
    """Quota use over time from the ``history_quota`` rollup: per key and step, slots
    granted minus given back, against the key's limit scaled to the step."""
    await use_quota(console.store, console.store, T0)
    _with_history(console)
    viewer, _ = await console.sign_in("viv")
    span = f"from={T0 // 1_000_000 - 60}&to={T0 // 1_000_000 + 240}"
    doc = await (await viewer.get(f"/admin/api/history?{span}")).get_json()
    k, other = doc["quota"]["keys"]
    assert (k["quota_key"], k["granted_total"], k["released_total"], k["used_total"]) == (
        "k", 3, 2, 1)
    assert (other["quota_key"], other["used_total"]) == ("other", 1)
    # 600 a minute: a one-minute step allows 600; one slot used is 0.2 % of it.
    assert (k["limit_count"], k["allowed_per_step"], k["peak_use_pct"]) == (600, 600.0, 0.2)
    (busy,) = [p for p in k["points"] if p["granted"]][:1]
    slots = await (await viewer.get(busy["items"].replace("/admin/", "/admin/api/", 1)))\
        .get_json()
    assert [s["state"] for s in slots["slots"]] == ["released", "reserved"]
    one = await (await viewer.get(f"/admin/api/history?{span}&key=other")).get_json()
    assert [q["quota_key"] for q in one["quota"]["keys"]] == ["other"]
    html = await (await viewer.get(f"/admin/history?{span}")).get_data(as_text=True)
    assert 'id="chart-history-quota"' in html and 'data-key="k"' in html
    link = re.search(r'<a class="point-link" href="([^"]+)" data-series="k"', html)
    assert link is not None
    page = await (await viewer.get(link[1].replace("&amp;", "&"))).get_data(as_text=True)
    assert all(f'href="/admin/work/{s["work_id"]}"' in page for s in slots["slots"])


async def test_executions_and_dlq_inflow_per_org_binding_and_operation_link_their_items(
        console: ConsoleHarness) -> None:
    """The executions and the DLQ inflow narrowed to the effect items of one org, binding
    or provider operation (history_rollup keyed by them, migration 0048); each point
    links to exactly the items behind it, the filters kept.

    Before: the filters did not narrow these charts (the page said "Not narrowed by org,
    binding or operation"), so a binding's dead items were lost among every family's."""
    ids = await finish_effects(console.store, T0)
    _with_history(console)
    viewer, _ = await console.sign_in("viv")
    span = f"from={T0 // 1_000_000 - 60}&to={T0 // 1_000_000 + 240}"
    everyone = await (await viewer.get(f"/admin/api/history?{span}")).get_json()
    assert {s["outcome"]: s["total"] for s in everyone["throughput"]} == {
        "succeeded": 4, "dead": 2}
    assert everyone["executions_narrowed"] is False
    for query, totals, dead in (
            ("binding=hubspot-eu", {"succeeded": 1, "dead": 2}, ["lead-c", "lead-d"]),
            ("org=org-1", {"succeeded": 2, "dead": 1}, ["lead-c"]),
            ("operation=hubspot.deal.create", {"succeeded": 2, "dead": 1}, ["lead-d"]),
            ("org=org-1&binding=hubspot-main", {"succeeded": 2}, []),
            ("binding=nobody", {}, [])):
        doc = await (await viewer.get(f"/admin/api/history?{span}&{query}")).get_json()
        assert doc["executions_narrowed"] is True, query
        assert {s["outcome"]: s["total"] for s in doc["throughput"]} == totals, query
        assert doc["dlq_inflow"]["total"] == len(dead), query
        points = [p for p in doc["dlq_inflow"]["points"] if p["executions"]]
        behind = set()
        for p in points:
            assert query in p["items"], (query, p["items"])
            listed = await (await viewer.get(p["items"].replace("/admin/", "/admin/api/", 1)))\
                .get_json()
            behind |= {e["work_id"] for e in listed["executions"]}
        assert behind == {ids[lead] for lead in dead}, query
    # The page: the narrowed charts say what they keep; their dots open the listing.
    html = await (await viewer.get(f"/admin/history?{span}&binding=hubspot-eu")).get_data(
        as_text=True)
    assert "Executions finished, by outcome (narrowed)" in html
    assert "DLQ inflow (narrowed)" in html
    assert "Only effect items of binding <code>hubspot-eu</code>" in html
    link = re.search(r'<a class="point-link" href="([^"]+binding=hubspot-eu[^"]*)"'
                     r' data-series="dead"', html)
    assert link is not None, html
    page = await (await viewer.get(link[1].replace("&amp;", "&"))).get_data(as_text=True)
    assert f'href="/admin/work/{ids["lead-c"]}"' in page
    assert f'href="/admin/work/{ids["lead-a"]}"' not in page
    assert "binding <code>hubspot-eu</code>" in page
