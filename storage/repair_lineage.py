"""Repair lineage: which Runtime intent a command answers, and what its history proves.

Theory of operation
-------------------
A command handed off by the Runtime (``handoff_key`` set) is the *root* of its
lineage. An operator's repair command (``repair_of``) answers the same
Runtime intent: at most one repair per command (a unique index), so a lineage
is a chain root -> repair -> repair of the repair ...

The Runtime knows only the root (its accepted command id). So when a command
of the chain settles, the receipt, if any, is the root's, bound to the root's
intent, command id, payload digest and Catalog revision (seed 003: "bound to
the original intent and accepted command"):

* a success carries the settling command's exact success result (its RemoteID);
* a no-effect result is sent only when the *whole* chain's history proves it
  (every attempt of every command, through :func:`history_no_effect_reason`):
  a repair that was refused before dispatch proves nothing about the root's
  dispatched attempts.

Otherwise no receipt is sent and the root intent stays blocking, which the
console shows with the one action that answers it (the operator-path table,
:mod:`daemon.core.operator_paths`, read by :mod:`storage.command_operator`).
"""

from __future__ import annotations

from collections.abc import Sequence

from daemon.core.handoff import NoEffectReason, NoEffectResult
from daemon.core.no_effect import AttemptFacts, no_effect_proof
from storage.commands import read_command
from storage.effect_values import Command, Settlement
from storage.port import SqlTx, WorkConflict
from storage.work_rows import placeholders

# A chain longer than this is a bug (each link is an audited operator action).
MAX_LINEAGE = 64


def history_no_effect_reason(intent_kind: str,
                             history: Sequence[AttemptFacts]) -> NoEffectReason | None:
    """The one place that asks "does this attempt history prove no effect?": the same
    pure proof the effect runner and the operator's retire use
    (:func:`daemon.core.no_effect.no_effect_proof`)."""
    return no_effect_proof(intent_kind, history).reason


async def lineage_of(tx: SqlTx, command: Command) -> list[Command]:
    """The chain from the root (handed-off) command to ``command``, root first."""
    chain = [command]
    while chain[0].repair_of is not None:
        if len(chain) > MAX_LINEAGE:
            raise WorkConflict(f"command {command.command_id}: repair lineage too long")
        parent = await read_command(tx, chain[0].repair_of)
        if parent is None:
            raise WorkConflict(f"command {chain[0].command_id}: repaired command"
                               f" {chain[0].repair_of} is missing")
        chain.insert(0, parent)
    return chain


async def lineage_history(tx: SqlTx, chain: Sequence[Command]) -> list[AttemptFacts]:
    """Every attempt of every command in ``chain`` (outcome, evidence, disposition), in
    order of dispatch."""
    ids = [c.command_id for c in chain]
    rows = await tx.fetchall(
        "SELECT outcome, evidence, disposition FROM effect_attempts"
        f" WHERE command_id IN ({placeholders(len(ids))})"
        " ORDER BY dispatch_started_at_us, attempt_id", ids)
    return [AttemptFacts(*(None if v is None else str(v) for v in r)) for r in rows]


async def lineage_no_effect(tx: SqlTx, command: Command) -> NoEffectReason | None:
    """What the whole lineage's history proves (None: not proven effect-free)."""
    return history_no_effect_reason(command.intent_kind,
                                    await lineage_history(tx, await lineage_of(tx, command)))


async def receipt_target(tx: SqlTx, command: Command, settlement: Settlement
                         ) -> tuple[Command, NoEffectResult | None] | None:
    """Whose receipt a settlement of ``command`` sends, and (for a no-effect
    settlement) the result the whole lineage proves; None: no receipt."""
    if command.handoff_key is not None:
        return command, None
    if command.repair_of is None:
        return None  # neither handed off nor a repair: nothing to answer
    chain = await lineage_of(tx, command)
    root = chain[0]
    if root.handoff_key is None:
        return None
    if settlement is Settlement.SUCCEEDED:
        return root, None
    if settlement is Settlement.NO_EFFECT:
        reason = history_no_effect_reason(root.intent_kind, await lineage_history(tx, chain))
        return (root, NoEffectResult(reason)) if reason is not None else None
    return None


async def repair_of(tx: SqlTx, command_id: str) -> str | None:
    """The repair command issued for ``command_id`` (at most one), if any."""
    rows = await tx.fetchall(
        "SELECT command_id FROM external_commands WHERE repair_of = ?", (command_id,))
    return str(rows[0][0]) if rows else None
