"""``integrationd keys status|rotate``: token-bundle keys, as an operator uses them.

``keys status`` lists which key seals how many stored bundles and checks that every one
of those keys is loaded and opens its bundles. ``keys rotate --actor NAME --reason TEXT``
(an admin) rewraps every bundle under ``[keys] active`` (a grant whose token refresh is
in flight is left to the refresh and counted as ``refreshing``: rotate again later); run
it after adding the new key and listing the old one in ``[keys] previous``, and drop the
old one once status shows it seals nothing. Nothing here prints or logs a token or a key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping

from config.keys import load_token_keys
from config.load import ConfigError
from config.settings import Settings
from daemon.admin_cli import record_cli_origin
from daemon.cli_commands import HELP
from daemon.services.clock import WallClock
from daemon.services.key_rotation import rotate_keys, verify_keys
from daemon.services.operator_api import NotAuthorized
from storage.migrate import check_schema
from storage.work_store import WorkStore

EXIT_OK, EXIT_FAILURE = 0, 1


def add_keys_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help=HELP["keys"])
    verbs = keys.add_subparsers(dest="keys_command", required=True, metavar="VERB")
    status = verbs.add_parser("status", help="which key seals how many bundles; check they"
                              " open")
    status.add_argument("--json", action="store_true", help="print JSON")
    rot = verbs.add_parser("rotate", help="rewrap every token bundle under [keys] active")
    rot.add_argument("--actor", required=True,
                     help="your operator name, as configured in [[operators]] (an admin)")
    rot.add_argument("--reason", required=True, help="why (kept in the audit log)")
    rot.add_argument("--json", action="store_true", help="print JSON")


async def run_keys_command(settings: Settings, args: argparse.Namespace,
                           open_database: Callable[[Settings], Awaitable[WorkStore]]) -> int:
    record_cli_origin()  # the OS user (and SUDO_USER) beside --actor in the audit log
    keys = load_token_keys(settings.keys, os.environ, settings.base_dir)
    if args.keys_command == "rotate":
        operator = settings.operator(args.actor)
        if operator is None or operator.role != "admin":
            raise NotAuthorized(f"{args.actor!r} may not rotate keys (admins only)")
        if not settings.keys.active:
            raise ConfigError("keys.active", "no active key to rotate to")
    store = await open_database(settings)
    try:
        await check_schema(store.db, store.dialect)
        if args.keys_command == "status":
            sealing = Counter(g.sealed.key_id for g in await store.grant_list())
            problems = await verify_keys(store, keys)
            doc = {"active": settings.keys.active or None, "loaded": sorted(keys),
                   "bundles_by_key": dict(sorted(sealing.items())), "problems": problems}
            sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.json
                             else status_text(doc))
            return EXIT_FAILURE if problems else EXIT_OK
        report = await rotate_keys(store, keys, settings.keys.active, actor=args.actor,
                                   reason=args.reason, now_us=WallClock().now_us())
        refused = [{"binding_id": b, "generation": g, "reason": r}
                   for b, g, r in report.refused]
        if args.json:
            sys.stdout.write(json.dumps({
                "active": settings.keys.active, "rewrapped": report.rewrapped,
                "already_current": report.already_current, "refused": refused,
                "refreshing": report.refreshing,
            }, indent=2) + "\n")
        else:
            sys.stdout.write(
                f"rewrapped {report.rewrapped} bundle(s) under key {settings.keys.active};"
                f" {report.already_current} already sealed with it; {len(refused)} refused"
                + (f"; {report.refreshing} being refreshed (left to the refresh: rotate"
                   " again once it is done)" if report.refreshing else "") + "\n"
                + "".join(f"  refused: {r['binding_id']} generation {r['generation']}:"
                          f" {r['reason']}\n" for r in refused))
        return EXIT_FAILURE if report.refused else EXIT_OK
    finally:
        await store.db.aclose()


def status_text(doc: Mapping[str, object]) -> str:
    """``keys status`` for people: the active key, what each key seals, any problem."""
    sealing = doc["bundles_by_key"]
    loaded = doc["loaded"]
    problems = doc["problems"]
    assert isinstance(sealing, dict) and isinstance(loaded, list)
    assert isinstance(problems, list)
    lines = [f"active key: {doc['active'] or 'none configured'}",
             f"loaded keys: {', '.join(loaded) or 'none'}"]
    if not sealing:
        lines.append("no token bundles are stored yet")
    lines += [f"  key {key} seals {count} bundle(s)" for key, count in sealing.items()]
    lines += [f"problem: {p}" for p in problems] or ["every stored bundle opens"]
    return "\n".join(lines) + "\n"
