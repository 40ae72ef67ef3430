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
from daemon.cli_commands import HELP
from daemon.core.human_time import wall_text
from daemon.services.clock import WallClock
from daemon.services.command_actions import repair_command, retire_command
from daemon.services.operator_api import BadRequest, authorize
from storage.command_repair import RepairActor
from storage.migrate import check_schema
from storage.work_store import WorkStore

EXIT_OK = 0


def add_command_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = sub.add_parser("command", help=HELP["command"])
    verbs = command.add_subparsers(dest="command_command", required=True, metavar="VERB")
    show = verbs.add_parser("show", help="the command, its attempts, its receipt and its"
                            " operator path (effect state, next action)")
    show.add_argument("command_id")
    show.add_argument("--json", action="store_true",
                      help="print JSON (times as epoch microseconds)")
    for verb, text in (("retire", "stop the command, settling what its history proves"
                        " (success, no effect) or retiring it without a receipt"),
                       ("repair", "issue a new command with repair lineage, pinned anew")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("command_id")
        p.add_argument("--actor", required=True,
                       help="your operator name, as configured in [[operators]] (role"
                            " operator or admin)")
        p.add_argument("--reason", required=True, help="why (kept in the audit log)")
        p.add_argument("--json", action="store_true", help="print JSON")


class CommandNotFound(Exception):
    """``command show`` of an id with no command (exit 1, as every not found)."""


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
                raise CommandNotFound(f"no command {args.command_id}")
            path = await store.command_operator_path(command.command_id,
                                                     (catalog.revision, catalog.digest))
            receipt = await store.receipt_get(command.command_id)
            doc = attrs.asdict(command)
            doc.pop("frozen_request", None)  # the request body is not shown to operators
            doc["scope"] = command.scope.as_json()
            doc["settlement"] = command.settlement.value
            shown = {"command": doc,
                     "attempts": [attrs.asdict(a) for a in
                                  await store.effect_attempts(command.command_id)],
                     "receipt": None if receipt is None else {
                         "result_format_version": receipt.result_format_version,
                         "remote_id": receipt.remote_id, "state": receipt.state.value},
                     "operator_path": None if path is None else path.as_json()}
            if args.json:
                _print(shown)
            else:
                sys.stdout.write(show_text(shown))
            return EXIT_OK
        assert who is not None
        if verb == "retire":
            settlement = await retire_command(store, settings, args.command_id, who, now)
            if args.json:
                _print({"command_id": args.command_id, "settlement": settlement.value})
            else:
                sys.stdout.write(f"retired {args.command_id}: settlement {settlement.value}\n")
            return EXIT_OK
        new_id = await repair_command(store, settings, catalog, args.command_id, who, now)
        if args.json:
            _print({"repair_of": args.command_id, "command_id": new_id})
        else:
            sys.stdout.write(f"repaired {args.command_id} as new command {new_id}\n")
        return EXIT_OK
    finally:
        await store.db.aclose()


def _when(us: object) -> str:
    return wall_text(us) if isinstance(us, int) and us > 0 else "-"


def show_text(shown: dict[str, Any]) -> str:
    """``command show`` for people: the command, each attempt on one line, the receipt and
    the operator path (its effect state and the one next action)."""
    command = shown["command"]
    lines = [f"command {command['command_id']}: settlement {command['settlement']}",
             f"  {command['operation']} of {command['local_object']} {command['local_id']}"
             f" (Runtime intent {command['intent_id']})",
             f"  pinned: binding {command['binding_id']} generation"
             f" {command['binding_generation']}, Catalog revision {command['catalog_revision']}"
             + (f", remote id {command['remote_id']}" if command.get("remote_id") else "")]
    attempts = shown["attempts"]
    lines.append(f"  attempts: {len(attempts) or 'none'}")
    for a in attempts:
        lines.append(
            f"    {a['attempt_id']}  {a['method']} {a['target_path']}"
            f"  sent {_when(a['dispatch_started_at_us'])}"
            f"  status {a['response_status'] if a['response_status'] is not None else '-'}"
            f"  outcome {a['outcome'] or 'unresolved'}"
            + (f"  disposition {a['disposition']}" if a.get("disposition") else ""))
    receipt = shown["receipt"]
    lines.append("  receipt: none" if receipt is None else
                 f"  receipt: {receipt['state']}"
                 f" (result format {receipt['result_format_version']})")
    path = shown["operator_path"]
    if path is not None:
        lines.append(f"  effect state: {path['effect_state']};"
                     f" next action: {path['next_action'] or 'none'}")
        lines.append(f"  {path['advice']}")
    return "\n".join(lines) + "\n"
