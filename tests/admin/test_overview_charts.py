"""The overview's charts and figures over HTTP (the real app on a real database), and the
pure chart geometry (table-driven)."""

from __future__ import annotations

import datetime as dt
import html
import json
import math
import re
import time

import pytest

from admin_ui.charts import Series, fmt_value, line_chart, nice_max, time_step_s, time_ticks
from daemon.core.latency import LatencyHistogram
from daemon.core.states import WorkState
from daemon.services.replica import HistoryPoint
from storage.flow import FlowSample
from storage.port import OutcomeCount, QueueDepth
from tests.admin.support import ConsoleHarness

SEC = 1_000_000
# 2026-12-01 08:00:00 UTC, for the pure tick tests.
BASE = int(dt.datetime(2026, 12, 1, 8, 0, tzinfo=dt.UTC).timestamp()) * SEC


def _recent_base() -> int:
    """Two to three minutes ago, on a whole minute (the axis runs to now)."""
    now_s = time.time()
    return (int(now_s // 60) * 60 - 120) * SEC


def _point(at_s: int, interval_s: float, depths: dict[tuple[str, WorkState], int],
           finished: dict[tuple[str, str], int], flow: FlowSample | None = None,
           base: int = BASE) -> HistoryPoint:
    return HistoryPoint(
        base + at_s * SEC, interval_s,
        tuple(QueueDepth(f, s, n, BASE) for (f, s), n in depths.items()),
        tuple(OutcomeCount(f, o, n) for (f, o), n in finished.items()),
        flow or FlowSample())


def _figure(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}">([^<]*)<', page)
    assert found is not None, element_id
    return found.group(1)


def _legend(page: str, family: str, chart: str) -> dict[str, str]:
    section = page.split(f'id="chart-{chart}-{family}"', 1)[1].split("</ul>", 1)[0]
    return dict(re.findall(r'<li data-series="([^"]+)">.*?<b class="figure">([^<]*)</b>',
                           section, re.DOTALL))


async def test_finished_per_s_is_one_figure_over_one_window(console: ConsoleHarness) -> None:
    """Finding: the overview showed two "finished/s" figures that disagreed (the card over
    a window that could run past 60 s, the chart's legend the last sample alone)."""
    history = console.replica.history
    # 7 s samples: a window that stops at "60 s or more" would take 63 s of them.
    for i in range(12):
        history.append(_point(i * 7, 7.0, {("noop", WorkState.PENDING): 5},
                              {("noop", "succeeded"): 7 * (i + 1), ("noop", "retry"): 7,
                               ("other", "dead"): 14}))
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/overview")).get_json()
    window = doc["throughput"]
    assert window["window_s"] == 56.0  # eight 7 s samples: the most that fit in 60 s
    succeeded = sum(7 * (i + 1) for i in range(4, 12))
    assert window["finished"] == succeeded + 8 * 14  # retry is not finished work
    assert window["per_s"] == round((succeeded + 8 * 14) / 56, 3)

    page = await (await client.get("/admin/")).get_data(as_text=True)
    assert _figure(page, "throughput-rate") == fmt_value(window["per_s"])
    assert _figure(page, "throughput-window") == "56 s"
    # The per-family legends read the same window: their finished outcomes sum to the card.
    noop = _legend(page, "noop", "finished")
    other = _legend(page, "other", "finished")
    legend_sum = sum(float(v.removesuffix("/s")) for k, v in (*noop.items(), *other.items())
                     if k != "retry")
    assert math.isclose(legend_sum, window["per_s"], abs_tol=0.02)
    assert noop["retry"] == "1/s"
    rows = {(r["family"], r["outcome"]): r["per_s"] for r in window["by_outcome"]}
    assert sum(v for (_, o), v in rows.items() if o != "retry") == pytest.approx(
        window["per_s"], abs=0.01)


async def test_each_family_gets_depth_and_outcome_charts_with_a_time_axis(
        console: ConsoleHarness) -> None:
    history = console.replica.history
    base = _recent_base()
    history.append(_point(0, 5.0, {("noop", WorkState.PENDING): 40,
                                   ("noop", WorkState.RETRY): 3}, {("noop", "succeeded"): 50},
                          base=base))
    history.append(_point(60, 60.0, {("noop", WorkState.PENDING): 10,
                                     ("noop", WorkState.DEAD): 2},
                          {("noop", "succeeded"): 600, ("noop", "dead"): 60}, base=base))
    history.append(_point(120, 60.0, {("noop", WorkState.PROCESSING): 4},
                          {("noop", "retry"): 120}, base=base))
    client, _ = await console.sign_in("viv")
    page = await (await client.get("/admin/")).get_data(as_text=True)
    depth = page.split('id="chart-depth-noop"', 1)[1].split("</svg>", 1)[0]
    # The time axis runs from the first sample to the newest (2 min): UTC labels on
    # whole 30 s steps, the first on the first sample's minute.
    labels = re.findall(r'class="tick time"[^>]*>([^<]+)<', depth)
    first = dt.datetime.fromtimestamp(base / SEC, tz=dt.UTC)
    assert labels == [(first + dt.timedelta(seconds=30 * k)).strftime("%H:%M:%S")
                      for k in range(len(labels))]
    assert 5 <= len(labels) <= 6
    assert "UTC" in depth
    # The y axis: nice ticks from 0 to 50 (the largest depth is 40).
    assert re.findall(r'class="tick" x="50" [^>]*>([^<]+)<', depth) == [
        "0", "12.5", "25", "37.5", "50"]
    # Retry and dead lines are always drawn, with every other state seen.
    assert re.findall(r'<polyline [^>]*data-series="([^"]+)"', depth) == [
        "pending", "processing", "retry", "dead"]
    finished = page.split('id="chart-finished-noop"', 1)[1].split("</svg>", 1)[0]
    assert re.findall(r'<polyline [^>]*data-series="([^"]+)"', finished) == [
        "succeeded", "retry", "dead"]
    assert _legend(page, "noop", "depth") == {"pending": "0", "processing": "4",
                                              "retry": "0", "dead": "0"}
    # The same fragment is what the live poll swaps in.
    fragment = await client.get("/admin/overview/live")
    assert fragment.status_code == 200
    body = await fragment.get_data(as_text=True)
    assert 'id="chart-depth-noop"' in body and "<html" not in body


async def test_a_new_sample_redraws_the_charts(console: ConsoleHarness) -> None:
    """The charts are computed once per sample: a page view after a new sample never
    shows the previous one's."""
    history = console.replica.history
    history.append(_point(0, 5.0, {("noop", WorkState.PENDING): 7}, {}))
    client, _ = await console.sign_in("viv")
    first = await (await client.get("/admin/overview/live")).get_data(as_text=True)
    again = await (await client.get("/admin/overview/live")).get_data(as_text=True)
    assert _legend(first, "noop", "depth")["pending"] == "7"
    def svg(page: str) -> str:
        return page.split('id="chart-depth-noop"', 1)[1].split("</svg>", 1)[0]

    assert svg(first) == svg(again)
    history.append(_point(5, 5.0, {("noop", WorkState.PENDING): 9}, {("noop", "dead"): 5}))
    after = await (await client.get("/admin/overview/live")).get_data(as_text=True)
    assert _legend(after, "noop", "depth")["pending"] == "9"
    assert _legend(after, "noop", "finished")["dead"] == "0.5/s"


async def test_effect_path_chart_and_latency_figures(console: ConsoleHarness) -> None:
    fast = LatencyHistogram.of([40_000] * 98 + [900_000] * 2)
    slow = LatencyHistogram.of([120_000] * 98 + [2_000_000] * 2)
    console.replica.history.append(_point(0, 10.0, {}, {}, FlowSample(
        accepted=50, effects=(("ACCEPTED", 40), ("OUTCOME_UNKNOWN", 2)),
        receipts_confirmed=30, to_response=fast, to_receipt=slow)))
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/overview")).get_json()
    flow = doc["flow"]
    assert (flow["accepted_per_s"], flow["receipts_per_s"]) == (5.0, 3.0)
    assert flow["effects_per_s"] == {"ACCEPTED": 4.0, "REJECTED": 0.0, "OUTCOME_UNKNOWN": 0.2}
    lat = flow["latency"]
    assert lat["samples"] == 100
    assert 40 <= lat["response_p50_ms"] < 44 and 900 <= lat["response_p99_ms"] < 982
    assert 120 <= lat["receipt_p50_ms"] < 131 and 2000 <= lat["receipt_p99_ms"] < 2182
    page = await (await client.get("/admin/")).get_data(as_text=True)
    assert _figure(page, "receipt-rate") == "3"
    assert _figure(page, "receipt-p99") == f"{lat['receipt_p99_ms']:,.0f} ms"
    latency = page.split('id="chart-latency"', 1)[1].split("</ul>", 1)[0]
    legend = dict(re.findall(r'<li data-series="([^"]+)">.*?<b class="figure">([^<]*)</b>',
                             latency, re.DOTALL))
    assert legend["receipt p99"] == f"{lat['receipt_p99_ms']:,.0f} ms"
    assert set(legend) == {"response p50", "response p99", "receipt p50", "receipt p99"}


async def test_charts_fragment_needs_a_signed_in_operator(console: ConsoleHarness) -> None:
    anonymous = await console.client().get("/admin/overview/live")
    assert anonymous.status_code in (302, 401)
    client, _ = await console.sign_in("viv")
    assert (await client.get("/admin/overview/live")).status_code == 200
    assert (await client.get("/admin/overview/live?x=1")).status_code == 200


async def test_audit_before_and_after_are_json_with_linked_ids(console: ConsoleHarness) -> None:
    (dead,) = await console.dead_items(1)
    client, csrf = await console.sign_in("otto")
    replay = await client.post(f"/admin/api/work/{dead}/replay",
                               json={"reason": "<b>provider</b> fixed"},
                               headers={"X-CSRF-Token": csrf})
    new_id = (await replay.get_json())["item"]["work_id"]
    page = await (await client.get("/admin/audit")).get_data(as_text=True)
    before = page.split('<pre class="json before">', 1)[1].split("</pre>", 1)[0]
    after = page.split('<pre class="json after">', 1)[1].split("</pre>", 1)[0]
    link = '<a class="id" href="/admin/work/{0}">{0}</a>'
    # Pretty JSON (two-space indent, sorted keys): the text is exactly json.dumps's.
    before_text = html.unescape(re.sub(r"<[^>]+>", "", before))
    before_doc = json.loads(before_text)
    assert before_text == json.dumps(before_doc, indent=2, sort_keys=True)
    assert (before_doc["state"], before_doc["work_id"]) == ("dead", dead)
    assert link.format(dead) in before
    after_text = html.unescape(re.sub(r"<[^>]+>", "", after))
    after_doc = json.loads(after_text)
    assert after_text == json.dumps(after_doc, indent=2, sort_keys=True)
    assert (after_doc["state"], after_doc["work_id"]) == ("pending", new_id)
    assert link.format(new_id) in after
    assert "&lt;b&gt;provider&lt;/b&gt; fixed" in page and "<b>provider</b>" not in page


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, 1.0), (-3, 1.0), (float("nan"), 1.0), (0.3, 0.5), (1, 1.0), (1.01, 2.0), (3, 5.0),
     (7, 10.0), (11, 20.0), (24, 25.0), (40, 50.0), (120, 200.0), (999, 1000.0)],
)
def test_nice_max(value: float, expected: float) -> None:
    assert nice_max(value) == expected


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (0.0004, "0"), (0.399, "0.4"), (3.0, "3"), (5.983, "5.98"), (12.25, "12.2"),
     (99.96, "100"), (1234.5, "1,234"), (-2.5, "-2.5")],
)
def test_one_number_format(value: float, text: str) -> None:
    assert fmt_value(value) == text


@pytest.mark.parametrize(
    ("span_s", "step"),
    [(1, 1), (6, 1), (7, 2), (30, 5), (60, 10), (120, 30), (900, 300), (3600, 600),
     (4 * 3600, 3600), (48 * 3600, 10800 * 3)],
)
def test_time_step(span_s: float, step: int) -> None:
    assert time_step_s(span_s) == step


def test_time_ticks_are_utc_and_on_whole_steps() -> None:
    # 63 s: 15 s steps, on whole multiples (not at the first sample's odd second).
    assert time_ticks(BASE + 7 * SEC, BASE + 70 * SEC) == [
        (BASE + 15 * SEC, "08:00:15"), (BASE + 30 * SEC, "08:00:30"),
        (BASE + 45 * SEC, "08:00:45"), (BASE + 60 * SEC, "08:01:00")]
    hours = time_ticks(BASE, BASE + 3600 * SEC)
    assert [t for _, t in hours] == ["08:00", "08:10", "08:20", "08:30", "08:40", "08:50",
                                     "09:00"]


def test_a_missing_value_splits_the_line_and_a_lone_value_is_a_dot() -> None:
    g = line_chart("c", "label", [Series("p99", ((BASE, 5.0), (BASE + SEC, 6.0),
                                                 (BASE + 2 * SEC, None), (BASE + 3 * SEC, 9.0)))],
                   "ms")
    assert len(g["lines"]) == 1 and len(g["dots"]) == 1
    assert g["lines"][0]["points"].count(",") == 2
    empty = line_chart("c", "label", [], "ms")
    assert empty["empty"] and empty["lines"] == []
