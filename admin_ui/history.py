"""The console's History page: executions by outcome and DLQ inflow over any range,
from the database (the ``history_rollup`` read model), so every replica draws the same
history and a restart loses none of it (issue 23 item 1).

Plugged in through :class:`admin_ui.extensions.ConsoleExtensions`. Routes:

* ``/admin/history`` (page) and ``/admin/api/history`` (JSON): a range (``range`` =
  ``15m|1h|6h|24h|7d``, or ``from`` and ``to``) and an optional ``family``; every point
  of a chart links to the items behind it;
* ``/admin/history/items`` and ``/admin/api/history/items``: the journaled executions of
  one bucket (``from``, ``to``, ``family``, ``outcome``), newest first, each linking to
  its work item.

Whatever cannot be parsed is a 400 naming the parameter (``admin_ui.filters.Args`` and
``daemon.core.history_range``). Read-only: the viewer role sees everything here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from quart import Blueprint, request
from quart.wrappers import Response

from admin_ui.auth import require
from admin_ui.charts import Series, color, fmt_value, line_chart, nice_max
from admin_ui.context import console
from admin_ui.errors import BadFilter
from admin_ui.extensions import ConsoleExtensions, NavItem
from admin_ui.filters import Args
from admin_ui.render import fmt_iso, page
from daemon.core.history_range import PRESETS_US, BadRange, HistoryRange, parse_time, resolve
from storage.history import HistoryExecution, HistoryPoint

ACTIONS = {"history.read": frozenset({"viewer", "operator", "admin"})}
HISTORY_KEYS = ("range", "from", "to", "family")
ITEMS_KEYS = ("from", "to", "family", "outcome", "limit")
ITEMS_MAX_SPAN_US = 7 * 24 * 3600 * 1_000_000
DEAD = "dead"


def parse_history(pairs: Iterable[tuple[str, str]], now_us: int) -> tuple[HistoryRange,
                                                                          str | None]:
    args = Args(pairs, HISTORY_KEYS)
    try:
        chosen = resolve(now_us, args.text("range"), args.text("from"), args.text("to"))
    except BadRange as exc:
        raise BadFilter(str(exc)) from None
    return chosen, args.text("family")


def _items_href(at_us: int, step_us: int, family: str | None, outcome: str) -> str:
    query = {"from": str(at_us // 1_000_000), "to": str((at_us + step_us) // 1_000_000),
             "outcome": outcome}
    if family:
        query["family"] = family
    return "/admin/history/items?" + urlencode(query)


def _series(points: list[HistoryPoint]) -> dict[str, dict[int, int]]:
    """Per outcome, executions per step bucket (every family of the filter summed)."""
    out: dict[str, dict[int, int]] = {}
    for p in points:
        per = out.setdefault(p.outcome, {})
        per[p.at_us] = per.get(p.at_us, 0) + p.executions
    return out


def _buckets(chosen: HistoryRange) -> list[int]:
    first = chosen.since_us - chosen.since_us % chosen.step_us
    return list(range(first, chosen.until_us, chosen.step_us))


def history_doc(points: list[HistoryPoint], chosen: HistoryRange,
                family: str | None) -> dict[str, Any]:
    """The JSON read model: per outcome a point per bucket (zero where none finished)."""
    per_outcome = _series(points)
    buckets = _buckets(chosen)
    series = []
    for outcome in sorted(per_outcome):
        counts = per_outcome[outcome]
        series.append({
            "outcome": outcome,
            "color": color(outcome),
            "total": sum(counts.values()),
            "points": [{"at_us": at, "at": fmt_iso(at), "executions": counts.get(at, 0),
                        "items": _items_href(at, chosen.step_us, family, outcome)}
                       for at in buckets],
        })
    return {
        "range": chosen.preset or "custom",
        "from_us": chosen.since_us, "to_us": chosen.until_us, "step_us": chosen.step_us,
        "from": fmt_iso(chosen.since_us), "to": fmt_iso(chosen.until_us),
        "family": family,
        "throughput": series,
        "dlq_inflow": next((s for s in series if s["outcome"] == DEAD),
                           {"outcome": DEAD, "color": color(DEAD), "total": 0,
                            "points": [{"at_us": at, "at": fmt_iso(at), "executions": 0,
                                        "items": _items_href(at, chosen.step_us, family, DEAD)}
                                       for at in buckets]}),
    }


def _chart(chart_id: str, label: str, series: list[dict[str, Any]],
           chosen: HistoryRange) -> dict[str, Any]:
    lines = [Series(s["outcome"], tuple((p["at_us"], float(p["executions"]))
                                        for p in s["points"])) for s in series]
    doc = line_chart(chart_id, label, lines, "per step", chosen.until_us)
    doc["links"] = _point_links(doc, series, chosen)
    return doc


def _point_links(doc: dict[str, Any], series: list[dict[str, Any]],
                 chosen: HistoryRange) -> list[dict[str, Any]]:
    """A clickable dot on every non-zero point, at the geometry ``line_chart`` drew."""
    if doc["empty"]:
        return []
    # The same scales as charts.line_chart, so a dot sits on its line.
    values = [float(p["executions"]) for s in series for p in s["points"]]
    top = nice_max(max(values, default=0.0))
    xs = [p["at_us"] for s in series for p in s["points"]]
    t0, t1 = min(xs), max(max(xs), chosen.until_us)
    t0 = min(t0, t1 - 1_000_000)
    x_scale = (doc["right"] - doc["left"]) / max(1, t1 - t0)
    y_scale = (doc["base"] - doc["top"]) / top
    links = []
    for s in series:
        for p in s["points"]:
            if p["executions"]:
                links.append({
                    "x": round(doc["left"] + (p["at_us"] - t0) * x_scale, 1),
                    "y": round(doc["base"] - p["executions"] * y_scale, 1),
                    "href": p["items"], "color": color(s["outcome"]),
                    "title": f"{s['outcome']}: {fmt_value(p['executions'])} at {p['at']}",
                    "series": s["outcome"], "at_us": p["at_us"],
                })
    return links


async def _history(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    view = console().view
    chosen, family = parse_history(pairs, view.clock.now_us())
    points = await view.store.history_outcomes(chosen.since_us, chosen.until_us,
                                               chosen.step_us, family)
    return history_doc(points, chosen, family)


def execution_json(e: HistoryExecution) -> dict[str, Any]:
    return {"work_id": e.work_id, "ownership_epoch": e.ownership_epoch, "family": e.family,
            "attempt": e.attempt, "replica": e.replica, "outcome": e.outcome,
            "finished_at_us": e.finished_at_us, "finished_at": fmt_iso(e.finished_at_us)}


async def _items(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    args = Args(pairs, ITEMS_KEYS)
    start, end = args.text("from"), args.text("to")
    if start is None or end is None:
        raise BadFilter("from and to are required (the bucket's start and end)")
    try:
        since, until = parse_time(start, "from"), parse_time(end, "to")
    except BadRange as exc:
        raise BadFilter(str(exc)) from None
    if until <= since:
        raise BadFilter("to must be later than from")
    if until - since > ITEMS_MAX_SPAN_US:
        raise BadFilter("a bucket is at most 7 days long")
    family, outcome = args.text("family"), args.text("outcome")
    limit = args.integer("limit", 100, 1, 500)
    rows = await console().view.store.history_executions(
        since, until, family=family, outcome=outcome, limit=limit)
    return {"from_us": since, "to_us": until, "from": fmt_iso(since), "to": fmt_iso(until),
            "family": family, "outcome": outcome, "limit": limit,
            "executions": [execution_json(e) for e in rows],
            "more": len(rows) == limit}


def build_blueprint() -> Blueprint:
    bp = Blueprint("history", __name__)

    @bp.get("/admin/history")
    @require("history.read")
    async def history_page() -> Response:
        doc = await _history(request.args.items(multi=True))
        chosen = HistoryRange(doc["from_us"], doc["to_us"], doc["step_us"],
                              None if doc["range"] == "custom" else doc["range"])
        charts = {
            "throughput": _chart("chart-history-throughput",
                                 "executions finished per step, by outcome",
                                 doc["throughput"], chosen),
            "dlq": _chart("chart-history-dlq", "DLQ inflow: executions that ended dead",
                          [doc["dlq_inflow"]], chosen),
        }
        return await page("history.html", doc=doc, charts=charts, presets=list(PRESETS_US),
                          step_text=_step_text(doc["step_us"]))

    @bp.get("/admin/api/history")
    @require("history.read")
    async def api_history() -> dict[str, Any]:
        return await _history(request.args.items(multi=True))

    @bp.get("/admin/history/items")
    @require("history.read")
    async def items_page() -> Response:
        return await page("history_items.html", doc=await _items(request.args.items(multi=True)))

    @bp.get("/admin/api/history/items")
    @require("history.read")
    async def api_items() -> dict[str, Any]:
        return await _items(request.args.items(multi=True))

    return bp


def _step_text(step_us: int) -> str:
    minutes = step_us // 60_000_000
    if minutes % 1440 == 0:
        return f"{minutes // 1440} d"
    if minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"


_EMPTY: dict[str, Any] = {"type": "string", "maxLength": 0}
_TIME = {"anyOf": [{"type": "string", "pattern": r"^\s*\d{1,11}\s*$"},
                   {"type": "string", "format": "date-time"}, _EMPTY]}


def _q(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema}


_ERRORS = {"400": {"$ref": "#/components/responses/BadRequest"},
           "401": {"$ref": "#/components/responses/Unauthenticated"},
           "403": {"$ref": "#/components/responses/Forbidden"},
           "503": {"$ref": "#/components/responses/DatabaseUnavailable"}}
_FAMILY = _q("family", "one work family (empty: all)", {"type": "string", "maxLength": 64})
OPENAPI_PATHS: dict[str, dict[str, Any]] = {
    "/admin/api/history": {"get": {
        "summary": "Executions by outcome and DLQ inflow per step over a range, cluster-wide,"
                   " from the history rollup; each point names the link to its items",
        "parameters": [
            _q("range", "a preset ending now (default 1h); not with from/to",
               {"anyOf": [{"type": "string", "enum": [*PRESETS_US, "custom"]}, _EMPTY]}),
            _q("from", "custom range start: ISO 8601 UTC or epoch seconds", _TIME),
            _q("to", "custom range end: ISO 8601 UTC or epoch seconds", _TIME),
            _FAMILY,
        ],
        "responses": {"200": {"description": "ok", "content": {"application/json": {
            "schema": {"type": "object", "required": ["range", "from_us", "to_us", "step_us",
                                                      "throughput", "dlq_inflow"]}}}},
                      **_ERRORS},
    }},
    "/admin/api/history/items": {"get": {
        "summary": "The journaled executions of one bucket, newest first",
        "parameters": [
            {**_q("from", "bucket start: ISO 8601 UTC or epoch seconds", _TIME),
             "required": True},
            {**_q("to", "bucket end: ISO 8601 UTC or epoch seconds", _TIME), "required": True},
            _FAMILY,
            _q("outcome", "one outcome (empty: all)", {"type": "string", "maxLength": 32}),
            _q("limit", "at most this many (1..500, default 100)",
               {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 500}, _EMPTY]}),
        ],
        "responses": {"200": {"description": "ok", "content": {"application/json": {
            "schema": {"type": "object", "required": ["executions", "more"]}}}},
                      **_ERRORS},
    }},
}


def history_extensions() -> ConsoleExtensions:
    return ConsoleExtensions(blueprints=[build_blueprint()],
                             nav=[NavItem("/admin/history", "History", "history.read")],
                             actions=dict(ACTIONS), openapi_paths=OPENAPI_PATHS)
