"""``integrationd catalog publish|list|show|delete``: Catalog revisions as facts.

* ``publish``: store the Catalog this configuration describes (the shipped L1
  definitions and its L2 bindings' non-secret fields) as revision
  ``catalog.revision`` (or ``--revision N``); idempotent for the same content,
  refused for other content under a published number. Audited.
* ``list``: every published revision, with the unsettled work pinned to it.
* ``show REV``: one revision's digest and canonical content (no secret is in it).
* ``delete REV``: remove a revision no unsettled work is pinned to. Audited.

A revision that is not published, named on the command line, is one line
naming it and exit 1 (as every "not found"); a malformed revision number is exit 2;
a refused publish or delete is one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import attrs

from config.catalog import load_catalog
from config.settings import Settings
from daemon.cli_commands import HELP
from daemon.services.catalog_view import publish_current
from daemon.services.clock import WallClock
from daemon.services.operator_api import authorize
from storage.port import CatalogRevision, RevisionNotPublished
from storage.work_store import WorkStore


class CatalogUsage(Exception):
    """Input the operator can fix: one line, exit 2."""


class CatalogNotFound(Exception):
    """The revision named is not published: one line, exit 1 (as every not found)."""


def _revision_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a revision number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive revision number, got {value}")
    return value


def add_catalog_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cat = sub.add_parser("catalog", help=HELP["catalog"])
    verbs = cat.add_subparsers(dest="catalog_command", required=True, metavar="VERB")
    pub = verbs.add_parser(
        "publish", help="publish this configuration's Catalog (L1 definitions + L2 bindings)")
    pub.add_argument("--revision", type=_revision_arg,
                     help="the revision number (default: catalog.revision)")
    pub.add_argument("--actor", required=True, help="operator name (must hold admin)")
    pub.add_argument("--reason", required=True, help="why (kept in the audit log)")
    pub.add_argument("--json", action="store_true", help="print JSON")
    lst = verbs.add_parser("list", help="published revisions, newest first")
    lst.add_argument("--json", action="store_true", help="print JSON")
    show = verbs.add_parser("show", help="one revision's digest and canonical content")
    show.add_argument("revision", metavar="REV", type=_revision_arg)
    show.add_argument("--json", action="store_true", help="print JSON")
    dele = verbs.add_parser("delete", help="delete a revision no unsettled work is pinned to")
    dele.add_argument("revision", metavar="REV", type=_revision_arg)
    dele.add_argument("--actor", required=True, help="operator name (must hold admin)")
    dele.add_argument("--reason", required=True, help="why (kept in the audit log)")


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _meta(rev: CatalogRevision) -> dict[str, Any]:
    return {"revision": rev.revision, "digest": rev.digest, "published_by": rev.published_by,
            "published_at_us": rev.published_at_us}


async def run_catalog_command(store: WorkStore, settings: Settings,
                              args: argparse.Namespace) -> None:
    verb = args.catalog_command
    now_us = WallClock().now_us()
    if verb == "publish":
        operator = authorize(settings, args.actor, "catalog.publish")
        if not args.reason.strip():
            raise CatalogUsage("--reason must not be empty")
        catalog = load_catalog(settings)
        if args.revision is not None:
            catalog = attrs.evolve(catalog, revision=args.revision)
        rev, created = await publish_current(store, catalog, actor=operator.name,
                                             role=operator.role, reason=args.reason,
                                             now_us=now_us)
        if args.json:
            _print_json(_meta(rev) | {"created": created})
        elif created:
            sys.stdout.write(f"published catalog revision {rev.revision} ({rev.digest})\n")
        else:
            sys.stdout.write(f"catalog revision {rev.revision} is already published with this"
                             f" content ({rev.digest})\n")
        return
    if verb == "list":
        docs = []
        for rev in await store.catalog_list():
            pins = await store.catalog_pins(rev.revision)
            docs.append(_meta(rev) | {"open_commands": pins.open_commands,
                                      "open_commands_more": pins.open_commands_more,
                                      "live_work": pins.live_work,
                                      "live_work_more": pins.live_work_more,
                                      "current": rev.revision == settings.catalog.revision})
        if args.json:
            _print_json({"revisions": docs})
            return
        if not docs:
            sys.stdout.write("no catalog revision is published (integrationd catalog publish)\n")
        for d in docs:
            # Counted up to PIN_COUNT_LIMIT each: "1000+" when there are more.
            commands = f"{d['open_commands']}{'+' if d['open_commands_more'] else ''}"
            work = f"{d['live_work']}{'+' if d['live_work_more'] else ''}"
            sys.stdout.write(
                f"{d['revision']:>6}  {d['digest']}  by {d['published_by']}"
                f"  open commands {commands}, live work {work}"
                f"{'  (current)' if d['current'] else ''}\n")
        return
    if verb == "show":
        found = await store.catalog_get(args.revision)
        if found is None:
            raise CatalogNotFound(f"REV: catalog revision {args.revision} is not published")
        if args.json:
            _print_json(_meta(found) | {"content": json.loads(found.content)})
        else:
            sys.stdout.write("\n".join(f"{k}: {v}" for k, v in _meta(found).items()) + "\n")
            _print_json(json.loads(found.content))
        return
    # delete
    operator = authorize(settings, args.actor, "catalog.delete")
    if not args.reason.strip():
        raise CatalogUsage("--reason must not be empty")
    try:
        gone = await store.catalog_delete(args.revision, actor=operator.name,
                                          role=operator.role, reason=args.reason,
                                          now_us=now_us)
    except RevisionNotPublished as exc:
        raise CatalogNotFound(f"REV: {exc}") from None
    sys.stdout.write(f"deleted catalog revision {gone.revision} ({gone.digest})\n")
