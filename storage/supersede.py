"""Intent order on one record: an older intent never overwrites a newer one that landed.

Theory of operation
-------------------
Commands for one local record run in admission order (the source lane) and
one at a time per remote record (the target lane). A replay or a repair runs
later, out of that order: it takes a new sequence at the *tail* of its lane,
so replaying the older of two Title changes would write the old Title over
the new one, whether the newer one already succeeded or is still queued or
running (it would then run first, and the replay after it). So a replay or a
repair of a command is refused when a command of a *newer* intent for the
same binding and local record, sharing at least one field with it, exists:
open or settled, whatever its settlement (a retired or no-effect newer intent
still says the Runtime's record moved on; fail closed). The check runs inside
the replay's (or the repair's) transaction, after it took the command's row
(:mod:`storage.command_operator`). "Newer" is the Runtime's admission order:
the time the lineage's root command was accepted (a repair inherits its
original's place). We refuse rather than keep the original order: keeping it would need
the newer intent to be re-sent after the replay, which integrationd cannot
ask the Runtime to do; the refusal tells the operator the old value is
obsolete (and the console shows which command superseded it).

The fields of a frozen request are the keys of its ``properties`` object
(the Runtime handoff's request shape); a request whose fields cannot be read
conflicts with every other one (fail closed).
"""

from __future__ import annotations

import json

from storage.commands import COMMAND_COLUMNS, command_from_row
from storage.effect_values import Command
from storage.port import SqlTx
from storage.repair_lineage import lineage_of

# Newer commands examined per check (a refusal needs only one).
_SCAN = 200


def request_fields(frozen_request: str) -> frozenset[str] | None:
    """The fields a frozen request writes; None when they cannot be told."""
    try:
        doc = json.loads(frozen_request)
    except ValueError:
        return None
    props = doc.get("properties") if isinstance(doc, dict) else None
    if not isinstance(props, dict) or not props:
        return None
    return frozenset(str(k) for k in props)


def _overlap(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    """The shared fields (None standing for "unknown: assume all")."""
    if a is None or b is None:
        return a or b or frozenset({"*"})
    return a & b


async def superseded_by(tx: SqlTx, command: Command) -> str | None:
    """Why a replay or repair of ``command`` would overwrite a newer intent, open or
    settled (or None)."""
    root = (await lineage_of(tx, command))[0]
    fields = request_fields(command.frozen_request)
    rows = await tx.fetchall(
        f"SELECT {COMMAND_COLUMNS} FROM external_commands WHERE local_object = ?"
        " AND local_id = ? AND binding_id = ? AND created_at_us > ?"
        " ORDER BY created_at_us LIMIT ?",
        (command.local_object, command.local_id, command.binding_id, root.created_at_us,
         _SCAN))
    for row in rows:
        other = command_from_row(row)
        if other.command_id == command.command_id:
            continue
        other_root = (await lineage_of(tx, other))[0]
        if other_root.command_id == root.command_id:
            continue  # the same intent's lineage
        if (other_root.created_at_us, other_root.command_id) <= (root.created_at_us,
                                                                root.command_id):
            continue  # a repair of an older intent: not newer
        shared = _overlap(fields, request_fields(other.frozen_request))
        if shared:
            return (f"a newer intent ({other_root.intent_id}, command {other.command_id},"
                    f" {other.settlement.value}) also sets {', '.join(sorted(shared))} on"
                    f" {command.local_object} {command.local_id}; replaying the older value"
                    " would overwrite it")
    return None
