"""The ``integrationd`` subcommands, in the order ``--help`` lists them: each one's line of
help and the module whose adder builds its parser (``module:function``).

Nothing here imports a subcommand's module: ``daemon/cli.py`` builds the chosen command's
parser from its module and a bare one (name and help only) for every other, so a call
pays the imports of its own command only (the console's Quart app, the reconciler and the
operator API load for the commands that use them). Each module's adder takes its help
from :data:`HELP`, so the two cannot differ.
"""

from __future__ import annotations

import argparse
from typing import Final

_KERNEL: Final = "daemon.cli_commands:add_kernel_commands"  # below: argparse only

# name -> (help, "module:adder"); the adder of a module that builds several commands is
# named by each of them and called once.
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "run": ("run one replica: workers, admin listener, metrics", _KERNEL),
    "migrate": ("apply pending schema migrations", _KERNEL),
    "check-config": ("validate the configuration and print it (no secrets)", _KERNEL),
    "work": ("operate on work items", _KERNEL),
    "hash-password": ("print an argon2id hash for an [[operators]] password_hash",
                      "daemon.admin_cli:add_operator_log_commands"),
    "audit": ("read the append-only operator audit log",
              "daemon.admin_cli:add_operator_log_commands"),
    "dlq": ("read and replay the dead-letter queue", "daemon.admin_cli:add_operator_log_commands"),
    "catalog": ("publish, list, show and delete Catalog revisions",
                "daemon.catalog_cli:add_catalog_command"),
    "reconcile": ("start, repair and inspect cursor reconciliation",
                  "daemon.reconcile_cli:add_reconcile_command"),
    "cutover": ("move a work family between the legacy owner and integrationd",
                "daemon.cutover_cli:add_cutover_command"),
    "subscriptions": ("reconcile and inspect webhook subscriptions",
                      "daemon.subscriptions_cli:add_subscriptions_command"),
    "keys": ("token-bundle encryption keys: status, rotate", "daemon.keys_cli:add_keys_commands"),
    "binding": ("principal bindings: list, show, transitions",
                "daemon.binding_cli:add_binding_commands"),
    "command": ("effect commands: where the Runtime intent stands, retire, repair",
                "daemon.command_cli:add_command_commands"),
    "link": ("remote links: show one, bind a local record to a remote one",
             "daemon.link_cli:add_link_commands"),
    "history": ("the console's history (executions, commands, latency over time)",
                "daemon.history_cli:add_history_command"),
    "attempts": ("provider calls (effect attempts), filtered", "daemon.find_cli:add_find_commands"),
    "receipts": ("Runtime result receipts, filtered", "daemon.find_cli:add_find_commands"),
    "search": ("find a work item, command, attempt, receipt, binding or remote record by any of"
               " its ids", "daemon.find_cli:add_find_commands"),
}

HELP: Final[dict[str, str]] = {name: help_text for name, (help_text, _) in COMMANDS.items()}

# Run by daemon.admin_cli.run_admin_command.
ADMIN_COMMANDS: Final = frozenset({"hash-password", "audit", "dlq", "catalog", "reconcile",
                                   "cutover", "subscriptions"})
FIND_COMMANDS: Final = frozenset({"attempts", "receipts", "search"})


def add_kernel_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``run``, ``migrate``, ``check-config`` and ``work`` (daemon/cli.py runs them)."""
    sub.add_parser("run", help=HELP["run"])
    sub.add_parser("migrate", help=HELP["migrate"])
    check = sub.add_parser("check-config", help=HELP["check-config"])
    check.add_argument("--connect", action="store_true",
                       help="also prove the database is reachable and fully migrated")

    work = sub.add_parser("work", help=HELP["work"]).add_subparsers(
        dest="work_command", required=True, metavar="VERB"
    )
    enq = work.add_parser("enqueue", help="enqueue work of a family")
    enq.add_argument("family", help="work family (e.g. noop)")
    enq.add_argument("--count", type=int, default=1, help="how many items (default 1)")
    enq.add_argument("--org", default="org-demo", help="org id (default org-demo)")
    enq.add_argument("--payload", default="{}", help="JSON object payload (default {})")
    enq.add_argument("--source-lane", help="source lane: items run in enqueue order")
    enq.add_argument("--target-lane", help="target lane: one item at a time")
    enq.add_argument("--delay", type=float, default=0.0, help="seconds before it may run")

    lst = work.add_parser("list", help="list work items, newest first")
    lst.add_argument("--state", help="filter by state (pending, dead, ...)")
    lst.add_argument("--family", help="filter by family")
    lst.add_argument("--org", help="filter by org id")
    lst.add_argument("--subject", help="filter by subject id")
    lst.add_argument("--lane", help="filter by source or target lane")
    lst.add_argument("--after", help="page: items older than this id")
    lst.add_argument("--limit", type=int, default=50, help="at most this many (max 1000)")
    lst.add_argument("--json", action="store_true", help="print JSON (one document)")

    show = work.add_parser("show", help="show one work item with its executions")
    show.add_argument("work_id")
    show.add_argument("--json", action="store_true", help="print JSON")

    rep = work.add_parser("replay", help="replay a terminal item as a new one with lineage")
    rep.add_argument("work_id")
    rep.add_argument("--actor", required=True, help="operator name (must hold operator/admin)")
    rep.add_argument("--reason", required=True, help="why (kept in the audit log)")
    rep.add_argument("--json", action="store_true", help="print the new item as JSON")

    can = work.add_parser("cancel", help="cancel an item (a running one acknowledges)")
    can.add_argument("work_id")
    can.add_argument("--actor", required=True, help="operator name (must hold operator/admin)")
    can.add_argument("--reason", required=True, help="why (kept in the audit log)")

    dep = work.add_parser("depths", help="queue depth per family and state")
    dep.add_argument("--json", action="store_true", help="print JSON (one document)")

    cnt = work.add_parser(
        "count", help="totals by family and state of the items created in a time range,"
                      " and the executions that finished in it by outcome")
    cnt.add_argument("--since", help="from this UTC time (2026-12-06T02:00:00Z) or age"
                                     " (90s, 15m, 6h, 7d); default: the beginning")
    cnt.add_argument("--until", help="up to this UTC time or age (default: now)")
    cnt.add_argument("--family", help="one family only")
    cnt.add_argument("--json", action="store_true", help="print JSON (one document)")
