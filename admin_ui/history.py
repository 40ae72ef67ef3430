"""The console's History page: executions by outcome, DLQ inflow, the effect path's
pressure (commands accepted against receipts confirmed) and latency (accept -> provider
answer -> Runtime receipt) over any range, from the database (the ``history_rollup``
and ``history_flow`` read models), so every replica draws the same history and a
restart loses none of it (issue 23 item 1).

Plugged in through :class:`admin_ui.extensions.ConsoleExtensions`. Routes:

* ``/admin/history`` (page) and ``/admin/api/history`` (JSON): a range (``range`` =
  ``15m|1h|6h|24h|7d``, or ``from`` and ``to``), an optional ``family`` (the executions'
  and the work queue's charts) and ``org``, ``binding``, ``operation`` (the executions'
  and DLQ inflow's, where they keep the effect family's items, and the effect path's
  charts; the work queue is sampled per family only, and the page says why); every
  point of a chart links to the items behind it;
* ``/admin/history/items`` and ``/admin/api/history/items``: the journaled executions of
  one bucket (``from``, ``to``, ``family``, ``outcome``, ``org``, ``binding``,
  ``operation``), newest first, each linking to
  its work item;
* ``/admin/history/commands`` and ``/admin/api/history/commands``: the commands of one
  bucket of the effect path (``metric`` = ``accepted|receipted``, ``from``, ``to``,
  ``org``, ``binding``, ``operation``), newest first, each linking to its command.

Whatever cannot be parsed is a 400 naming the parameter (``admin_ui.filters.Args`` and
``daemon.core.history_range``). Read-only: the viewer role sees everything here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

import attrs
from quart import Blueprint, request
from quart.wrappers import Response

from admin_ui.auth import require
from admin_ui.charts import Series, color, fmt_value, line_chart, nice_max
from admin_ui.context import console
from admin_ui.errors import BadFilter
from admin_ui.extensions import ConsoleExtensions, NavItem
from admin_ui.filters import Args
from admin_ui.history_flow import flow_doc, latency_lines, pressure_lines
from admin_ui.history_pressure import pressure_doc, queue_pressure_lines
from admin_ui.history_quota import quota_doc, quota_lines
from admin_ui.render import fmt_iso, page
from daemon.core.history_range import PRESETS_US, BadRange, HistoryRange, parse_time, resolve
from daemon.core.human_time import latency_text
from storage.history import ExecutionFilter, HistoryExecution, HistoryPoint
from storage.history_flow import METRICS, FlowCommand, FlowFilter
from storage.work_store import WorkStore

ACTIONS = {"history.read": frozenset({"viewer", "operator", "admin"})}
FLOW_KEYS = ("org", "binding", "operation")
HISTORY_KEYS = ("range", "from", "to", "family", *FLOW_KEYS, "key")
ITEMS_KEYS = ("from", "to", "family", "outcome", *FLOW_KEYS, "limit")
COMMANDS_KEYS = ("metric", "from", "to", *FLOW_KEYS, "limit")
SLOTS_KEYS = ("key", "from", "to", "limit")
# A line of points per (name, dashed): (at_us, value or None, link, time text).
Line = tuple[str, bool, list[tuple[int, float | None, str, str]]]
ITEMS_MAX_SPAN_US = 7 * 24 * 3600 * 1_000_000
DEAD = "dead"


# The widths of the rollups' key columns (migrations 0043, 0048): a longer value can
# match nothing, so it is refused as unparsable rather than answered empty.
FLOW_KEY_MAX = 128
# The queue pressure chart is per family only: why, for the page and the JSON.
QUEUE_NOT_NARROWED = (
    "the queue is sampled once a minute per family from the work_items_ready index, each"
    " count stopping at 100,000 entries; a count per org would read every open item's"
    " index entry each minute with no cap and write a row per org, and an item's binding"
    " and operation are on its command, not on the work item, so a count per binding or"
    " operation would join every open effect item to its command each minute")


def _flow_filter(args: Args) -> FlowFilter:
    values = {}
    for key in FLOW_KEYS:
        value = args.text(key)
        if value is not None and len(value) > FLOW_KEY_MAX:
            raise BadFilter(f"{key} is longer than {FLOW_KEY_MAX} characters")
        values[key] = value
    return FlowFilter(**values)


def execution_filter(family: str | None, where: FlowFilter) -> ExecutionFilter:
    return ExecutionFilter(family=family, org=where.org, binding=where.binding,
                           operation=where.operation)


@attrs.frozen
class HistoryQuery:
    """What a History request names: the range, the executions' family, the effect
    path's filters and the quota key."""

    chosen: HistoryRange
    family: str | None
    where: FlowFilter
    quota_key: str | None


def parse_history(pairs: Iterable[tuple[str, str]], now_us: int) -> HistoryQuery:
    """BadFilter (a 400 naming what it cannot read) for whatever cannot be parsed."""
    args = Args(pairs, HISTORY_KEYS)
    try:
        chosen = resolve(now_us, args.text("range"), args.text("from"), args.text("to"))
    except BadRange as exc:
        raise BadFilter(str(exc)) from None
    return HistoryQuery(chosen, args.text("family"), _flow_filter(args), args.text("key"))


def _items_href(at_us: int, step_us: int, narrow: ExecutionFilter, outcome: str) -> str:
    query = {"from": str(at_us // 1_000_000), "to": str((at_us + step_us) // 1_000_000),
             "outcome": outcome}
    for key, value in (("family", narrow.family), ("org", narrow.org),
                       ("binding", narrow.binding), ("operation", narrow.operation)):
        if value:
            query[key] = value
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
                narrow: ExecutionFilter) -> dict[str, Any]:
    """The JSON read model: per outcome a point per bucket (zero where none finished),
    narrowed by family and, for the effect family's items, org, binding and operation."""
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
                        "items": _items_href(at, chosen.step_us, narrow, outcome)}
                       for at in buckets],
        })
    return {
        "range": chosen.preset or "custom",
        "from_us": chosen.since_us, "to_us": chosen.until_us, "step_us": chosen.step_us,
        "from": fmt_iso(chosen.since_us), "to": fmt_iso(chosen.until_us),
        "family": narrow.family,
        # Org, binding and operation keep only the effect family's executions (no other
        # family's item carries them).
        "executions_narrowed": narrow.narrowed(),
        "throughput": series,
        "dlq_inflow": next((s for s in series if s["outcome"] == DEAD),
                           {"outcome": DEAD, "color": color(DEAD), "total": 0,
                            "points": [{"at_us": at, "at": fmt_iso(at), "executions": 0,
                                        "items": _items_href(at, chosen.step_us, narrow, DEAD)}
                                       for at in buckets]}),
    }


def outcome_lines(series: list[dict[str, Any]]) -> list[Line]:
    return [(s["outcome"], False, [(p["at_us"], float(p["executions"]), p["items"], p["at"])
                                   for p in s["points"]]) for s in series]


def _chart(chart_id: str, label: str, lines: list[Line], chosen: HistoryRange,
           unit: str = "per step") -> dict[str, Any]:
    doc = line_chart(chart_id, label,
                     [Series(name, tuple((at, v) for at, v, _, _ in points), dashed)
                      for name, dashed, points in lines], unit, chosen.until_us)
    if not any(v is not None for _, _, points in lines for _, v, _, _ in points):
        doc["empty"] = True  # nothing measured (a latency range with no receipt)
    doc["links"] = _point_links(doc, lines, chosen, unit)
    return doc


def _point_links(doc: dict[str, Any], lines: list[Line], chosen: HistoryRange,
                 unit: str) -> list[dict[str, Any]]:
    """A clickable dot on every non-zero point, at the geometry ``line_chart`` drew."""
    if doc["empty"]:
        return []
    # The same scales as charts.line_chart, so a dot sits on its line.
    values = [v for _, _, points in lines for _, v, _, _ in points if v is not None]
    top = nice_max(max(values, default=0.0))
    xs = [at for _, _, points in lines for at, _, _, _ in points]
    t0, t1 = min(xs), max(max(xs), chosen.until_us)
    t0 = min(t0, t1 - 1_000_000)
    x_scale = (doc["right"] - doc["left"]) / max(1, t1 - t0)
    y_scale = (doc["base"] - doc["top"]) / top
    suffix = f" {unit}" if unit != "per step" else ""
    links = []
    for name, _, points in lines:
        for at, value, href, at_text in points:
            if value and href:
                links.append({
                    "x": round(doc["left"] + (at - t0) * x_scale, 1),
                    "y": round(doc["base"] - value * y_scale, 1),
                    "href": href, "color": color(name),
                    "title": f"{name}: {fmt_value(value)}{suffix} at {at_text}",
                    "series": name, "at_us": at,
                })
    return links


async def history_for(store: WorkStore, pairs: Iterable[tuple[str, str]],
                      now_us: int) -> dict[str, Any]:
    """The History read model (page, API and ``integrationd history show``): two reads
    of the rollups, each an index range on (level, bucket)."""
    q = parse_history(pairs, now_us)
    chosen, family, where = q.chosen, q.family, q.where
    narrow = execution_filter(family, where)
    points = await store.history_outcomes(chosen.since_us, chosen.until_us,
                                          chosen.step_us, family, where=narrow)
    flow = await store.history_flow(chosen.since_us, chosen.until_us, chosen.step_us, where)
    slots, limits = await store.history_quota(chosen.since_us, chosen.until_us,
                                              chosen.step_us, q.quota_key)
    queue = await store.history_pressure(chosen.since_us, chosen.until_us, chosen.step_us,
                                         family)
    queue_doc = pressure_doc(queue, chosen, family, _buckets(chosen))
    # The filters given that this chart does not apply (and why), never silently.
    queue_doc["not_narrowed_by"] = [k for k in FLOW_KEYS if getattr(where, k) is not None]
    queue_doc["not_narrowed_because"] = (QUEUE_NOT_NARROWED if queue_doc["not_narrowed_by"]
                                         else None)
    return {**history_doc(points, chosen, narrow),
            "filters": {"family": family, "org": where.org, "binding": where.binding,
                        "operation": where.operation, "key": q.quota_key},
            **flow_doc(flow, chosen, where),
            "quota": quota_doc(slots, limits, chosen, _buckets(chosen)),
            "queue_pressure": queue_doc}


async def _history(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    view = console().view
    return await history_for(view.store, pairs, view.clock.now_us())


def execution_json(e: HistoryExecution) -> dict[str, Any]:
    return {"work_id": e.work_id, "ownership_epoch": e.ownership_epoch, "family": e.family,
            "attempt": e.attempt, "replica": e.replica, "outcome": e.outcome,
            "finished_at_us": e.finished_at_us, "finished_at": fmt_iso(e.finished_at_us)}


def _bucket(args: Args) -> tuple[int, int]:
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
    return since, until


def command_json(c: FlowCommand) -> dict[str, Any]:
    def ms(later: int | None) -> float | None:
        return None if later is None else round((later - c.accepted_at_us) / 1000, 1)

    return {"command_id": c.command_id, "org_id": c.org_id, "binding_id": c.binding_id,
            "operation": c.operation, "settlement": c.settlement,
            "accepted_at_us": c.accepted_at_us, "accepted_at": fmt_iso(c.accepted_at_us),
            "answered_at_us": c.answered_at_us, "confirmed_at_us": c.confirmed_at_us,
            "confirmed_at": None if c.confirmed_at_us is None else fmt_iso(c.confirmed_at_us),
            "response_ms": ms(c.answered_at_us), "receipt_ms": ms(c.confirmed_at_us)}


async def _commands(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    args = Args(pairs, COMMANDS_KEYS)
    metric = args.text("metric")
    if metric not in METRICS:
        raise BadFilter(f"metric must be one of {', '.join(METRICS)}")
    since, until = _bucket(args)
    where = _flow_filter(args)
    limit = args.integer("limit", 100, 1, 500)
    rows = await console().view.store.history_flow_commands(since, until, metric, where,
                                                            limit)
    return {"metric": metric, "from_us": since, "to_us": until, "from": fmt_iso(since),
            "to": fmt_iso(until), "org": where.org, "binding": where.binding,
            "operation": where.operation, "limit": limit,
            "commands": [command_json(c) for c in rows], "more": len(rows) == limit}


async def _slots(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    args = Args(pairs, SLOTS_KEYS)
    quota_key = args.text("key")
    if quota_key is None:
        raise BadFilter("key is required (the quota key)")
    since, until = _bucket(args)
    limit = args.integer("limit", 100, 1, 500)
    rows = await console().view.store.history_quota_slots(quota_key, since, until, limit)
    return {"key": quota_key, "from_us": since, "to_us": until, "from": fmt_iso(since),
            "to": fmt_iso(until), "limit": limit, "more": len(rows) == limit,
            "slots": [{"reservation_id": r.reservation_id, "work_id": r.work_id,
                       "state": r.state, "slot_at_us": r.slot_at_us,
                       "slot_at": fmt_iso(r.slot_at_us)} for r in rows]}


async def _items(pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    args = Args(pairs, ITEMS_KEYS)
    since, until = _bucket(args)
    family, outcome = args.text("family"), args.text("outcome")
    where = _flow_filter(args)
    limit = args.integer("limit", 100, 1, 500)
    rows = await console().view.store.history_executions(
        since, until, family=family, outcome=outcome, limit=limit,
        where=execution_filter(family, where))
    return {"from_us": since, "to_us": until, "from": fmt_iso(since), "to": fmt_iso(until),
            "family": family, "outcome": outcome, "org": where.org,
            "binding": where.binding, "operation": where.operation, "limit": limit,
            "executions": [execution_json(e) for e in rows],
            "more": len(rows) == limit}


def build_blueprint() -> Blueprint:
    bp = Blueprint("history", __name__)
    bp.add_app_template_filter(latency_text, "ms")

    @bp.get("/admin/history")
    @require("history.read")
    async def history_page() -> Response:
        doc = await _history(request.args.items(multi=True))
        chosen = HistoryRange(doc["from_us"], doc["to_us"], doc["step_us"],
                              None if doc["range"] == "custom" else doc["range"])
        charts = {
            "queue": _chart("chart-history-queue",
                            "work queue per family: ready, waiting and claimed items"
                            " (the highest per-minute sample in each step)",
                            queue_pressure_lines(doc), chosen, unit="items"),
            "throughput": _chart("chart-history-throughput",
                                 "executions finished per step, by outcome",
                                 outcome_lines(doc["throughput"]), chosen),
            "dlq": _chart("chart-history-dlq", "DLQ inflow: executions that ended dead",
                          outcome_lines([doc["dlq_inflow"]]), chosen),
            "pressure": _chart("chart-history-pressure",
                               "commands accepted against receipts confirmed per step",
                               pressure_lines(doc), chosen),
            "latency": _chart("chart-history-latency",
                              "latency from accept to provider answer and to Runtime receipt",
                              latency_lines(doc), chosen, unit="ms"),
            "quota": _chart("chart-history-quota",
                            "quota slots used per step, in percent of the key's limit",
                            quota_lines(doc), chosen, unit="%"),
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

    @bp.get("/admin/history/commands")
    @require("history.read")
    async def commands_page() -> Response:
        return await page("history_commands.html",
                          doc=await _commands(request.args.items(multi=True)))

    @bp.get("/admin/api/history/commands")
    @require("history.read")
    async def api_commands() -> dict[str, Any]:
        return await _commands(request.args.items(multi=True))

    @bp.get("/admin/history/slots")
    @require("history.read")
    async def slots_page() -> Response:
        return await page("history_slots.html",
                          doc=await _slots(request.args.items(multi=True)))

    @bp.get("/admin/api/history/slots")
    @require("history.read")
    async def api_slots() -> dict[str, Any]:
        return await _slots(request.args.items(multi=True))

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
_NARROWS = ("the executions and DLQ inflow (only the effect family's items carry it) and"
            " the effect path's charts; not the work queue's; empty: all")
_FLOW = [_q("org", f"one org ({_NARROWS})", {"type": "string", "maxLength": 128}),
         _q("binding", f"one binding id ({_NARROWS})", {"type": "string", "maxLength": 128}),
         _q("operation", f"one provider operation ({_NARROWS})",
            {"type": "string", "maxLength": 128})]
_LIMIT = _q("limit", "at most this many (1..500, default 100)",
            {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 500}, _EMPTY]})
OPENAPI_PATHS: dict[str, dict[str, Any]] = {
    "/admin/api/history": {"get": {
        "summary": "The work queue's pressure (ready, waiting, claimed items per family,"
                   " sampled once a minute), executions by outcome, DLQ inflow, the effect"
                   " path's pressure (commands"
                   " accepted, receipts confirmed) and latency (accept to provider answer"
                   " to Runtime receipt, p50/p95/p99) per step over a range, cluster-wide,"
                   " from the history rollups; each point names the link to its items",
        "parameters": [
            _q("range", "a preset ending now (default 1h); not with from/to",
               {"anyOf": [{"type": "string", "enum": [*PRESETS_US, "custom"]}, _EMPTY]}),
            _q("from", "custom range start: ISO 8601 UTC or epoch seconds", _TIME),
            _q("to", "custom range end: ISO 8601 UTC or epoch seconds", _TIME),
            _FAMILY, *_FLOW,
            _q("key", "one quota key (the quota chart; empty: the busiest keys)",
               {"type": "string", "maxLength": 255}),
        ],
        "responses": {"200": {"description": "ok", "content": {"application/json": {
            "schema": {"type": "object", "required": ["range", "from_us", "to_us", "step_us",
                                                      "throughput", "dlq_inflow", "filters",
                                                      "pressure", "latency", "quota",
                                                      "queue_pressure"]}}}},
                      **_ERRORS},
    }},
    "/admin/api/history/items": {"get": {
        "summary": "The journaled executions of one bucket, newest first (with org,"
                   " binding or operation: the effect family's items of that command's"
                   " org, binding or operation)",
        "parameters": [
            {**_q("from", "bucket start: ISO 8601 UTC or epoch seconds", _TIME),
             "required": True},
            {**_q("to", "bucket end: ISO 8601 UTC or epoch seconds", _TIME), "required": True},
            _FAMILY,
            _q("outcome", "one outcome (empty: all)", {"type": "string", "maxLength": 32}),
            *_FLOW, _LIMIT,
        ],
        "responses": {"200": {"description": "ok", "content": {"application/json": {
            "schema": {"type": "object", "required": ["executions", "more"]}}}},
                      **_ERRORS},
    }},
    "/admin/api/history/commands": {"get": {
        "summary": "The commands of one bucket of the effect path: accepted in it, or whose"
                   " Runtime receipt was confirmed in it, newest first, with their latencies",
        "parameters": [
            {**_q("metric", "accepted or receipted",
                  {"type": "string", "enum": list(METRICS)}), "required": True},
            {**_q("from", "bucket start: ISO 8601 UTC or epoch seconds", _TIME),
             "required": True},
            {**_q("to", "bucket end: ISO 8601 UTC or epoch seconds", _TIME), "required": True},
            *_FLOW, _LIMIT,
        ],
        "responses": {"200": {"description": "ok", "content": {"application/json": {
            "schema": {"type": "object", "required": ["commands", "more"]}}}},
                      **_ERRORS},
    }},
    "/admin/api/history/slots": {"get": {
        "summary": "The quota reservations of one key whose slot falls in one bucket,"
                   " newest first, each naming its work item",
        "parameters": [
            {**_q("key", "the quota key", {"type": "string", "minLength": 1,
                                           "maxLength": 255}), "required": True},
            {**_q("from", "bucket start: ISO 8601 UTC or epoch seconds", _TIME),
             "required": True},
            {**_q("to", "bucket end: ISO 8601 UTC or epoch seconds", _TIME), "required": True},
            _LIMIT,
        ],
        "responses": {"200": {"description": "ok", "content": {"application/json": {
            "schema": {"type": "object", "required": ["slots", "more"]}}}},
                      **_ERRORS},
    }},
}


def history_extensions() -> ConsoleExtensions:
    return ConsoleExtensions(blueprints=[build_blueprint()],
                             nav=[NavItem("/admin/history", "History", "history.read")],
                             actions=dict(ACTIONS), openapi_paths=OPENAPI_PATHS)
