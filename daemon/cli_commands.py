"""The ``integrationd`` subcommands, in the order ``--help`` lists them: each one's line of
help and the module whose adder builds its parser (``module:function``).

Nothing here imports a subcommand's module: ``daemon/cli.py`` builds the chosen command's
parser from its module and a bare one (name and help only) for every other, so a call
pays the imports of its own command only (the console's Quart app, the reconciler and the
operator API load for the commands that use them). Each module's adder takes its help
from :data:`HELP`, so the two cannot differ.
"""

from __future__ import annotations

from typing import Final

# name -> (help, "module:adder"); the adder of a module that builds several commands is
# named by each of them and called once.
COMMANDS: Final[dict[str, tuple[str, str]]] = {
    "run": ("run one replica: workers, admin listener, metrics", "daemon.cli:add_kernel_commands"),
    "migrate": ("apply pending schema migrations", "daemon.cli:add_kernel_commands"),
    "check-config": ("validate the configuration and print it (no secrets)",
                     "daemon.cli:add_kernel_commands"),
    "work": ("operate on work items", "daemon.cli:add_kernel_commands"),
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
