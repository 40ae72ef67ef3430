"""``integrationd history show|rebuild``: the console's history, and its rebuild.

``show`` prints what the console's History page draws (the same read model:
``admin_ui.history.history_for``), for a range and the same filters, as plain text or,
with ``--json``, the exact document ``/admin/api/history`` answers.

``rebuild`` recomputes the rollups (``history_rollup``, storage/history.py, from the
execution journal; ``history_flow``, storage/history_flow.py, from the commands and
receipts; the hour and day peaks of ``history_pressure``, storage/history_pressure.py,
from its per-minute samples of the work items), read models kept in the same
transactions as the rows they count, from the rows still kept, whole UTC days at a time
(older days, whose rows retention removed, stay as counted; ``--from`` names the first
day to rebuild). Safe while replicas run: each day is deleted and recounted in one
transaction. Nothing decides work from the rollups, so this changes no work and is not
audited.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from admin_ui.errors import BadFilter
from config.settings import Settings
from daemon.cli_commands import HELP
from daemon.core.history_range import PRESETS_US, BadRange, parse_time
from daemon.core.human_time import latency_text, wall_text
from daemon.services.clock import WallClock
from daemon.services.operator_api import BadRequest
from storage.work_store import WorkStore

EXIT_OK = 0


def add_history_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hist = sub.add_parser("history", help=HELP["history"])
    verbs = hist.add_subparsers(dest="history_command", required=True, metavar="VERB")
    show = verbs.add_parser("show", help="what the console's History page shows, per step")
    show.add_argument("--range", choices=list(PRESETS_US), dest="preset",
                      help="a range ending now (default 1h; not with --from/--to)")
    show.add_argument("--from", dest="from_time", metavar="TIME",
                      help="custom range start: ISO 8601 UTC or epoch seconds")
    show.add_argument("--to", dest="to_time", metavar="TIME",
                      help="custom range end: ISO 8601 UTC or epoch seconds")
    show.add_argument("--family", help="executions of this family only")
    show.add_argument("--org", help="the executions (effect items) and the effect path of"
                                    " this org only; the work queue stays per family")
    show.add_argument("--binding", help="the executions (effect items) and the effect path"
                                        " of this binding only")
    show.add_argument("--operation", help="the executions (effect items) and the effect path"
                                          " of this provider operation only")
    show.add_argument("--key", help="the quota use of this quota key only")
    show.add_argument("--json", action="store_true",
                      help="print the document /admin/api/history answers")
    rebuild = verbs.add_parser("rebuild",
                               help="recompute the history from the stored executions")
    rebuild.add_argument("--from", dest="from_time", metavar="TIME",
                         help="rebuild from this time's UTC day (ISO 8601 or epoch seconds;"
                              " default: the first whole day of executions still stored)")
    rebuild.add_argument("--json", action="store_true", help="print JSON")


async def run_history_command(settings: Settings, args: argparse.Namespace,
                              open_store: Callable[[Settings], Awaitable[WorkStore]]) -> int:
    if args.history_command == "show":
        return await _show(settings, args, open_store)
    since = None
    if args.from_time is not None:
        try:
            since = parse_time(args.from_time, "--from")
        except BadRange as exc:
            raise BadRequest(str(exc)) from None
    store = await open_store(settings)
    try:
        rows = await store.history_rebuild(since)
        flow_rows = await store.history_flow_rebuild(since)
        quota_rows = await store.history_quota_rebuild(since)
        pressure_rows = await store.history_pressure_rebuild(since)
    finally:
        await store.db.aclose()
    if args.json:
        sys.stdout.write(json.dumps({"rebuilt_rows": rows, "rebuilt_flow_rows": flow_rows,
                                     "rebuilt_quota_rows": quota_rows,
                                     "rebuilt_pressure_rows": pressure_rows}) + "\n")
    else:
        sys.stdout.write(f"history rebuilt: {rows} rollup rows from the stored executions,"
                         f" {flow_rows} from the stored commands and receipts,"
                         f" {quota_rows} from the stored quota reservations,"
                         f" {pressure_rows} queue peaks from the queue's samples\n")
    return EXIT_OK


def _pairs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The query the console would get for these options (parsed by the same code)."""
    named = (("range", args.preset), ("from", args.from_time), ("to", args.to_time),
             ("family", args.family), ("org", args.org), ("binding", args.binding),
             ("operation", args.operation), ("key", args.key))
    return [(key, value) for key, value in named if value is not None]


async def _show(settings: Settings, args: argparse.Namespace,
                open_store: Callable[[Settings], Awaitable[WorkStore]]) -> int:
    # The console's own read model (imported here: the other verbs need no web framework).
    from admin_ui.history import history_for

    store = await open_store(settings)
    try:
        doc = await history_for(store, _pairs(args), WallClock().now_us())
    except BadFilter as exc:
        raise BadRequest(str(exc)) from None
    finally:
        await store.db.aclose()
    if args.json:
        sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    else:
        sys.stdout.write(show_text(doc))
    return EXIT_OK


def _ms(value: float | None) -> str:
    return "-" if value is None else latency_text(value)


def _count(n: int | None, more: bool) -> str:
    """A sampled count: "-" where no replica sampled, "N+" where the count stopped."""
    return "-" if n is None else f"{n}+" if more else str(n)


def show_text(doc: dict[str, Any]) -> str:
    """One line per step: executions by outcome, commands accepted and receipts confirmed,
    latency p50/p99 to the provider's answer and to the Runtime's receipt."""
    filters = ", ".join(f"{k} {v}" for k, v in doc["filters"].items() if v) or "all"
    outcomes = [s["outcome"] for s in doc["throughput"]]
    queue = doc["queue_pressure"]["series"]
    lines = [f"history {wall_text(doc['from_us'])} to {wall_text(doc['to_us'])}"
             f" ({doc['range']}, one row per {doc['step_us'] // 60_000_000} min;"
             f" filters: {filters})",
             "totals: " + (", ".join(f"{s['outcome']} {s['total']}" for s in doc["throughput"])
                           or "no executions")
             + f"; commands accepted {doc['pressure'][0]['total']},"
               f" receipts confirmed {doc['pressure'][1]['total']}",
             "latency over the range: answer p50 "
             f"{_ms(doc['latency']['response']['range']['p50_ms'])} p99"
             f" {_ms(doc['latency']['response']['range']['p99_ms'])}, receipt p50"
             f" {_ms(doc['latency']['receipt']['range']['p50_ms'])} p99"
             f" {_ms(doc['latency']['receipt']['range']['p99_ms'])}",
             "queue peaks (highest per-minute sample; ready/retry wait/held/claimed): "
             + "/".join(_count(s["peak"], s["more"]) for s in queue)
             + f" ({doc['queue_pressure']['sampled_steps']} of"
               f" {doc['queue_pressure']['steps']} steps sampled"
             + ("" if not doc["queue_pressure"]["not_narrowed_by"] else
                "; not narrowed by " + ", ".join(doc["queue_pressure"]["not_narrowed_by"])
                + ": " + doc["queue_pressure"]["not_narrowed_because"]) + ")",
             "  ".join(["time (UTC)".ljust(20), *outcomes, "accepted", "receipted",
                        "answer p50/p99", "receipt p50/p99", "queue r/rw/h/c"])]
    per_outcome = {s["outcome"]: s["points"] for s in doc["throughput"]}
    for i, accepted in enumerate(doc["pressure"][0]["points"]):
        response = doc["latency"]["response"]["points"][i]
        receipt = doc["latency"]["receipt"]["points"][i]
        cells = [wall_text(accepted["at_us"]).ljust(20),
                 *(str(per_outcome[o][i]["executions"]).rjust(len(o)) for o in outcomes),
                 str(accepted["count"]).rjust(8),
                 str(doc["pressure"][1]["points"][i]["count"]).rjust(9),
                 f"{_ms(response['p50_ms'])}/{_ms(response['p99_ms'])}".rjust(14),
                 f"{_ms(receipt['p50_ms'])}/{_ms(receipt['p99_ms'])}".rjust(15),
                 "/".join(_count(q["points"][i]["n"], q["points"][i]["more"])
                          for q in queue).rjust(14)]
        lines.append("  ".join(cells))
    for k in doc["quota"]["keys"]:
        limit = ("unknown limit" if k["limit_count"] is None else
                 f"limit {k['limit_count']} per {k['window_us'] // 1_000_000} s,"
                 f" {k['allowed_per_step']} per step")
        peak = "-" if k["peak_use_pct"] is None else f"{k['peak_use_pct']} %"
        lines.append(f"quota {k['quota_key']}: {limit}; granted {k['granted_total']},"
                     f" given back {k['released_total']}, used {k['used_total']},"
                     f" peak {peak} of the limit")
    return "\n".join(lines) + "\n"
