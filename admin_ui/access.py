"""Who may do what in the console: roles -> actions, checked at request time.

The work actions (``work.read``, ``work.replay``, ``work.cancel``...) are the
ones :mod:`daemon.services.operator_api` already enforces for the CLI; the
console adds its own reads and bulk actions here. Extensions (e.g. the effect
journal's repair pages) add theirs through ``ConsoleExtensions.actions``.

Roles: ``viewer`` reads; ``operator`` also replays, cancels and repairs;
``admin`` may do everything, including the console-only admin pages.
"""

from __future__ import annotations

from collections.abc import Mapping

from daemon.services.operator_api import ACTION_ROLES

READ = frozenset({"viewer", "operator", "admin"})
OPERATE = frozenset({"operator", "admin"})
ADMIN = frozenset({"admin"})

CONSOLE_ACTIONS: Mapping[str, frozenset[str]] = {
    **ACTION_ROLES,
    "console.read": READ,
    "audit.read": READ,
    "dlq.read": READ,
    "dlq.replay": OPERATE,
    "operators.read": ADMIN,
}


def action_table(extra: Mapping[str, frozenset[str]] | None = None) -> dict[str, frozenset[str]]:
    """The console's action table plus an extension's; an unknown action is a bug."""
    table = dict(CONSOLE_ACTIONS)
    for action, roles in (extra or {}).items():
        if action in table and table[action] != roles:
            raise ValueError(f"extension redefines the roles of {action!r}")
        table[action] = roles
    return table


def allowed(table: Mapping[str, frozenset[str]], role: str, action: str) -> bool:
    return role in table[action]
