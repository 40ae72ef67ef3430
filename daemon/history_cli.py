"""``integrationd history rebuild``: recompute the console's history rollup from the rows.

The rollup (``history_rollup``, storage/history.py) is a read model kept in the same
transaction as the execution journal; this command rebuilds it from the journal rows
still kept, whole UTC days at a time (older days, whose rows retention removed, stay as
counted; ``--from`` names the first day to rebuild). Safe while
replicas run: each batch of minutes is deleted and recounted in one transaction.
Nothing decides work from the rollup, so this changes no work and is not audited.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable

from config.settings import Settings
from daemon.core.history_range import BadRange, parse_time
from daemon.services.operator_api import BadRequest
from storage.work_store import WorkStore

EXIT_OK = 0


def add_history_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    hist = sub.add_parser("history", help="the console's history (executions over time)")
    verbs = hist.add_subparsers(dest="history_command", required=True, metavar="VERB")
    rebuild = verbs.add_parser("rebuild",
                               help="recompute the history from the stored executions")
    rebuild.add_argument("--from", dest="from_time", metavar="TIME",
                         help="rebuild from this time's UTC day (ISO 8601 or epoch seconds;"
                              " default: the first whole day of executions still stored)")
    rebuild.add_argument("--json", action="store_true", help="print JSON")


async def run_history_command(settings: Settings, args: argparse.Namespace,
                              open_store: Callable[[Settings], Awaitable[WorkStore]]) -> int:
    since = None
    if args.from_time is not None:
        try:
            since = parse_time(args.from_time, "--from")
        except BadRange as exc:
            raise BadRequest(str(exc)) from None
    store = await open_store(settings)
    try:
        rows = await store.history_rebuild(since)
    finally:
        await store.db.aclose()
    if args.json:
        sys.stdout.write(json.dumps({"rebuilt_rows": rows}) + "\n")
    else:
        sys.stdout.write(f"history rebuilt: {rows} rollup rows from the stored executions\n")
    return EXIT_OK
