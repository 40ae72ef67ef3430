"""``integrationd link ...``: RemoteLinks as audited operator actions.

``link show`` prints the link of one local record under a configured binding's durable
remote account (its state, generation and remote record). ``link bind`` binds a local
record to an existing remote record after the uniqueness checks: it adopts the remote
record when the local record has no link (or a retired one), and rebinds an active link
to another record only when the operator names the generation they saw
(``--generation N``); a rebind moves the generation, so work queued under the old one is
refused at its dispatch checkpoint and never reaches either record. Admins only
(``--actor``, ``--reason`` required, the OS user recorded beside the actor); a refusal
prints its stable code and a sentence and writes nothing (exit 1). A local record with
no link is not found (exit 1). Text by default, ``--json`` for the document.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from config.settings import Settings
from daemon.admin_cli import record_cli_origin
from daemon.cli_commands import HELP
from daemon.services.clock import WallClock
from daemon.services.link_operations import bind_remote_record, bound_json, link_json, show_link
from storage.migrate import check_schema
from storage.work_store import WorkStore

EXIT_OK = 0
EXIT_NOT_FOUND = 1


def add_link_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    link = sub.add_parser("link", help=HELP["link"])
    verbs = link.add_subparsers(dest="link_command", required=True, metavar="VERB")
    show = verbs.add_parser("show", help="the link of one local record")
    bind = verbs.add_parser("bind", help="bind a local record to an existing remote record"
                            " (admins; a rebind names --generation)")
    for p in (show, bind):
        p.add_argument("--binding", required=True, help="the configured binding id")
        p.add_argument("--local-object", default="lead", help="local object (default lead)")
        p.add_argument("--local-id", required=True, help="local record id")
        p.add_argument("--actor", required=True,
                       help="operator name (a configured [[operators]] entry)")
        p.add_argument("--json", action="store_true", help="print JSON")
    bind.add_argument("--remote-object", default="contact",
                      help="remote object (default contact)")
    bind.add_argument("--remote-id", required=True, help="the existing remote record's id")
    bind.add_argument("--generation", type=int,
                      help="the link generation you saw (required to rebind an active link;"
                      " refused if it has moved)")
    bind.add_argument("--reason", required=True, help="why (kept in the audit log)")


async def run_link_command(settings: Settings, args: argparse.Namespace,
                           open_database: Callable[[Settings], Awaitable[WorkStore]]) -> int:
    record_cli_origin()  # the OS user (and SUDO_USER) beside --actor in the audit log
    store = await open_database(settings)
    try:
        await check_schema(store.db, store.dialect)
        if args.link_command == "show":
            link = await show_link(store, settings, actor=args.actor, binding_id=args.binding,
                                   local_object=args.local_object, local_id=args.local_id)
            if link is None:
                sys.stderr.write(f"integrationd: no link for {args.local_object}"
                                 f" {args.local_id} under binding {args.binding}\n")
                return EXIT_NOT_FOUND
            if args.json:
                _print(link_json(link))
            else:
                sys.stdout.write(_link_text(link_json(link)) + "\n")
            return EXIT_OK
        bound = await bind_remote_record(
            store, settings, WallClock(), actor=args.actor, binding_id=args.binding,
            local_object=args.local_object, local_id=args.local_id,
            remote_object=args.remote_object, remote_id=args.remote_id,
            expected_generation=args.generation, reason=args.reason)
        doc = bound_json(bound)
        if args.json:
            _print(doc)
        else:
            sys.stdout.write(f"{doc['outcome']}: {_link_text(doc['link'])}\n")
        return EXIT_OK
    finally:
        await store.db.aclose()


def _link_text(doc: dict[str, Any] | None) -> str:
    if doc is None:
        return "no link"
    return (f"link {doc['link_key']}: {doc['local_object']} {doc['local_id']} ->"
            f" {doc['remote_object'] or '-'} {doc['remote_id'] or '-'}, {doc['state']},"
            f" generation {doc['generation']}")


def _print(doc: object) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
