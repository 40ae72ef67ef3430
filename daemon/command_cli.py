"""``integrationd command ...``: where an effect command's Runtime intent stands, and the
operator actions that settle it.

``command show ID`` prints the command (never its request body), its attempts, its
Runtime receipt and its operator path: the effect state, the one next action that
leads to the receipt and the advice, from the same table the console shows
(``daemon/core/operator_paths.py``; docs/operations.md, "Operator paths").
``command retire ID`` and ``command repair ID`` (an operator or admin, ``--actor`` and
``--reason`` required, the OS user recorded beside the actor) perform the action; the
store decides it from the table in the action's own transaction, so a refusal is the
table's: one line naming its code, its sentence and the action to take instead
(exit 1), and nothing is written. A disposition on an unresolved attempt is recorded
in the console (``/admin/effects``), where its provider evidence is attached.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from config.catalog import load_catalog
from config.settings import Settings
from daemon.admin_cli import record_cli_origin
from daemon.services.clock import WallClock
from daemon.services.command_actions import repair_command, retire_command
from daemon.services.operator_api import BadRequest, authorize
from storage.command_repair import RepairActor
from storage.migrate import check_schema
from storage.work_store import WorkStore

EXIT_OK = 0


def add_command_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = sub.add_parser("command", help="effect commands: where the Runtime intent stands,"
                             " retire, repair")
    verbs = command.add_subparsers(dest="command_command", required=True, metavar="VERB")
    show = verbs.add_parser("show", help="the command, its attempts, its receipt and its"
                            " operator path (effect state, next action)")
    show.add_argument("command_id")
    for verb, text in (("retire", "stop the command, settling what its history proves"
                        " (success, no effect) or retiring it without a receipt"),
                       ("repair", "issue a new command with repair lineage, pinned anew")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("command_id")
        p.add_argument("--actor", required=True, help="operator name (operator or admin)")
        p.add_argument("--reason", required=True, help="why (kept in the audit log)")


def _print(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


async def run_command_command(settings: Settings, args: argparse.Namespace,
                              open_database: Callable[[Settings], Awaitable[WorkStore]]) -> int:
    verb = args.command_command
    record_cli_origin()  # the OS user (and SUDO_USER) beside --actor in the audit log
    who = None
    if verb != "show":
        if not args.reason.strip():
            raise BadRequest(f"a {verb} needs a reason")
        operator = authorize(settings, args.actor, "command.repair")
        who = RepairActor(actor=operator.name, role=operator.role, reason=args.reason)
    catalog = load_catalog(settings)
    store = await open_database(settings)
    try:
        await check_schema(store.db, store.dialect)
        now = WallClock().now_us()
        if verb == "show":
            command = await store.command_get(args.command_id)
            if command is None:
                raise BadRequest(f"no command {args.command_id}")
            path = await store.command_operator_path(command.command_id,
                                                     (catalog.revision, catalog.digest))
            receipt = await store.receipt_get(command.command_id)
            doc = attrs.asdict(command)
            doc.pop("frozen_request", None)  # the request body is not shown to operators
            doc["scope"] = command.scope.as_json()
            doc["settlement"] = command.settlement.value
            _print({"command": doc,
                    "attempts": [attrs.asdict(a) for a in
                                 await store.effect_attempts(command.command_id)],
                    "receipt": None if receipt is None else {
                        "result_format_version": receipt.result_format_version,
                        "remote_id": receipt.remote_id, "state": receipt.state.value},
                    "operator_path": None if path is None else path.as_json()})
            return EXIT_OK
        assert who is not None
        if verb == "retire":
            settlement = await retire_command(store, settings, args.command_id, who, now)
            _print({"command_id": args.command_id, "settlement": settlement.value})
            return EXIT_OK
        new_id = await repair_command(store, settings, catalog, args.command_id, who, now)
        _print({"repair_of": args.command_id, "command_id": new_id})
        return EXIT_OK
    finally:
        await store.db.aclose()
