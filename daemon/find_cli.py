"""``integrationd attempts list|show``, ``receipts list``, ``search``: the console's "find"
lists from the command line, on the durable rows (cluster-wide).

Same filters, the same strict parsing and the same page token as the console
(:mod:`admin_ui.find_filters`): ``attempts list --status 429 --since 1h --json``; a page
that was full prints the next page's ``--after`` on stderr. Plain text by default,
``--json`` for the documents the admin API returns. A filter that cannot be read is one
line and exit 2; an attempt that does not exist, or a search that finds nothing, exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from admin_ui.errors import BadFilter, NotFound
from admin_ui.find import LISTINGS, attempt_detail, read_listing
from admin_ui.find_filters import parse_search
from config.settings import Settings
from daemon.cli_commands import FIND_COMMANDS, HELP
from daemon.core.human_time import wall_text
from daemon.services.clock import WallClock
from storage.find_rows import SCAN_WINDOW, search
from storage.migrate import check_schema
from storage.work_store import WorkStore

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
_PAGE_FLAGS = (("since", "rows at or after this time: ISO 8601 UTC or 15m, 6h, 7d back"),
               ("until", "rows before this time (same forms)"),
               ("after", "page token: the --after a full page printed"),
               ("sort", "newest (default) or oldest"),
               ("limit", "rows per page, 1..200 (default 50)"))

__all__ = ["FIND_COMMANDS", "add_find_commands", "run_find_command"]


def _page_flags(parser: argparse.ArgumentParser) -> None:
    for name, help_text in _PAGE_FLAGS:
        parser.add_argument(f"--{name}", help=help_text)
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_find_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    attempts = sub.add_parser("attempts", help=HELP["attempts"])
    verbs = attempts.add_subparsers(dest="attempts_command", required=True, metavar="VERB")
    lst = verbs.add_parser("list", help="attempts, newest first, filtered")
    lst.add_argument("--status", help="HTTP status the provider answered, e.g. 429")
    lst.add_argument("--outcome", help="outcome class (ACCEPTED, REJECTED, OUTCOME_UNKNOWN,"
                                       " REPLAY_SAFE_RETRY, RETRYABLE_PRE_DISPATCH) or none")
    lst.add_argument("--operation", help="provider operation")
    lst.add_argument("--binding", help="binding id")
    _page_flags(lst)
    show = verbs.add_parser("show", help="one attempt: what was sent and what came back")
    show.add_argument("attempt_id")
    show.add_argument("--json", action="store_true", help="print JSON")
    receipts = sub.add_parser("receipts", help=HELP["receipts"])
    rverbs = receipts.add_subparsers(dest="receipts_command", required=True, metavar="VERB")
    rlst = rverbs.add_parser("list", help="receipts, newest first")
    rlst.add_argument("--status", help="pending, refused or confirmed")
    _page_flags(rlst)
    found = sub.add_parser("search", help=HELP["search"])
    found.add_argument("id")
    found.add_argument("--json", action="store_true", help="print JSON")


def _pairs(args: argparse.Namespace, keys: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(k, str(getattr(args, k))) for k in keys if getattr(args, k, None) is not None]


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _when(us: int | None) -> str:
    return wall_text(us) if us else "-"


def _attempt_line(a: dict[str, Any]) -> str:
    return (f"{a['attempt_id']}  {_when(a['dispatch_started_at_us'])}  {a['operation']}"
            f"  {a['method']} {a['target_path']}  HTTP {a['response_status'] or '-'}"
            f"  {a['outcome'] or 'no outcome'}  binding {a['binding_id']}")


def _receipt_line(r: dict[str, Any]) -> str:
    return (f"{r['command_id']}  {r['status']}  written {_when(r['created_at_us'])}"
            f"  remote {r['remote_id'] or '-'}"
            + (f"  refused: {r['last_error']}" if r["last_error"] else ""))


async def _list(store: WorkStore, key: str, pairs: list[tuple[str, str]], as_json: bool,
                line: Callable[[dict[str, Any]], str]) -> int:
    listing = LISTINGS[key]
    query = listing.parse(pairs, WallClock().now_us())
    doc = await read_listing(listing, store, query)
    rows, token = doc["items"], doc["next_after"]
    if as_json:
        _print_json(doc)
        return EXIT_OK
    if not rows and token is None:
        sys.stdout.write(f"no {listing.title.lower()} match\n")
    if doc["window_ended"]:
        sys.stderr.write(f"looked at {SCAN_WINDOW:,} attempts without filling the page\n")
    for row in rows:
        sys.stdout.write(line(row) + "\n")
    if token is not None:
        sys.stderr.write(f"more: repeat with --after {token}\n")
    return EXIT_OK


def _show_text(doc: dict[str, Any]) -> str:
    a = doc["attempt"]
    lines = [_attempt_line(a), f"  command {a['command_id']}  work item {a['work_id']}"]
    lines += [f"  sent header {name}: {value}" for name, value in a["request_headers"]]
    exchange = doc["exchange"]
    if exchange is None:
        lines.append("  no exchange kept (a success, a call that never left, or older)")
    else:
        lines.append(f"  request body: {exchange['request_body'] or '(empty)'}")
        lines += [f"  answer header {name}: {value}"
                  for name, value in exchange["response_headers"]]
        lines.append(f"  answer body: {exchange['response_body'] or '(empty)'}")
    return "\n".join(lines) + "\n"


async def _run(store: WorkStore, args: argparse.Namespace) -> int:
    if args.command == "attempts" and args.attempts_command == "list":
        return await _list(store, "attempts", _pairs(args, (
            "status", "outcome", "operation", "binding", "since", "until", "after", "sort",
            "limit")), args.json, _attempt_line)
    if args.command == "attempts":
        doc = await attempt_detail(store, args.attempt_id)
        if args.json:
            _print_json(doc)
        else:
            sys.stdout.write(_show_text(doc))
        return EXIT_OK
    if args.command == "receipts":
        return await _list(store, "receipts", _pairs(args, (
            "status", "since", "until", "after", "sort", "limit")), args.json, _receipt_line)
    hits = await search(store, parse_search([("q", args.id)]))
    if args.json:
        _print_json({"q": args.id, "matches": [
            {"kind": h.kind, "id": h.id, "summary": h.summary, "href": h.href} for h in hits]})
    for hit in [] if args.json else hits:
        sys.stdout.write(f"{hit.kind}  {hit.id}  {hit.summary}\n")
    if not hits:
        sys.stderr.write(f"integrationd: nothing has the id {args.id!r}\n")
        return EXIT_FAILURE
    return EXIT_OK


async def run_find_command(settings: Settings, args: argparse.Namespace,
                           open_database: Callable[[Settings], Awaitable[WorkStore]]) -> int:
    store = await open_database(settings)
    try:
        await check_schema(store.db, store.dialect)
        return await _run(store, args)
    except BadFilter as exc:
        sys.stderr.write(f"integrationd: {exc.message}\n")
        return EXIT_USAGE
    except NotFound as exc:
        sys.stderr.write(f"integrationd: {exc.message}\n")
        return EXIT_FAILURE
    finally:
        await store.db.aclose()
