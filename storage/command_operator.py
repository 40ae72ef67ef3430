"""The operator-path table (:mod:`daemon.core.operator_paths`) applied inside the
transaction of each operator action on a command.

Theory of operation
-------------------
An operator action on a command (retire, repair, a replay of its work item) is
decided and performed in one transaction whose *first* statement takes the
command's row (:func:`lock_command`: it bumps ``operator_version``). The effect
runner's settlement writes the same row. So two actions on one command, or an
action and a settlement, are serialized by the row: on one node the second waits
for the first's COMMIT and then reads what it committed (sessions run at READ
COMMITTED); across Galera nodes the loser fails certification at COMMIT and its
whole transaction is retried. Only then are the facts read
(:func:`read_facts`) and the table asked (:func:`decide`): a refusal raises
:class:`ActionRefused` (a stable code, a sentence, the one action that leads to
the receipt instead) and rolls back the lock with everything else, so a refusal
writes nothing.
"""

from __future__ import annotations

import attrs

from daemon.core.operator_paths import (
    Action,
    Allowed,
    CommandFacts,
    Refused,
    advice,
    advice_sentence,
    effect_state,
    verdict,
)
from daemon.core.principals import BindingState
from daemon.core.states import TERMINAL
from storage.catalog_revisions import read_revision
from storage.commands import read_command
from storage.effect_values import Command
from storage.effects import attempts_of
from storage.operator_refusal import ActionRefused
from storage.port import Database, SqlTx, WorkNotFound
from storage.principals import read_binding
from storage.repair_lineage import lineage_no_effect, repair_of
from storage.supersede import superseded_by
from storage.work_rows import in_states


@attrs.frozen
class FactsRead:
    """A command's facts as one transaction read them, with the details a refusal or
    the console names."""

    command: Command
    facts: CommandFacts
    repaired_by: str | None = None
    superseded: str | None = None  # why a newer intent supersedes it
    pins: str | None = None  # which pin moved

    @property
    def state(self) -> str:
        return effect_state(self.facts).value

    @property
    def advice(self) -> str:
        return advice_sentence(self.facts)

    def detail(self, code: str) -> str:
        return {"repaired": f"repaired by {self.repaired_by}",
                "superseded": self.superseded or "",
                "pins_moved": self.pins or ""}.get(code, "")

    def as_json(self) -> dict[str, str | None]:
        action = advice(self.facts)
        return {"effect_state": self.state, "next_action": action.value if action else None,
                "advice": self.advice, "repaired_by": self.repaired_by,
                "superseded": self.superseded, "pins_moved": self.pins}


async def lock_command(tx: SqlTx, command_id: str) -> Command:
    """Take the command's row for this transaction (see the module's theory)."""
    if not await tx.execute(
            "UPDATE external_commands SET operator_version = operator_version + 1"
            " WHERE command_id = ?", (command_id,)):
        raise WorkNotFound(command_id)
    command = await read_command(tx, command_id)
    assert command is not None
    return command


async def _pins_moved(tx: SqlTx, command: Command,
                      current: tuple[int, str] | None) -> str | None:
    """Which pin of ``command`` is no longer current (None: all are). ``current``: the
    Catalog revision the caller resolved as current (None: not resolved: moved)."""
    binding = await read_binding(tx, command.binding_id)
    if binding is None or binding.state is not BindingState.CONNECTED \
            or binding.generation != command.binding_generation:
        now = "none" if binding is None else f"{binding.generation} ({binding.state.value})"
        return (f"the pinned binding generation {command.binding_generation} is not the"
                f" current connected one: {now}")
    if current is None:
        return "the current Catalog revision was not resolved"
    if (command.catalog_revision, command.catalog_digest) != current:
        return (f"the command is pinned to Catalog revision {command.catalog_revision};"
                f" the current one is {current[0]}")
    published = await read_revision(tx, current[0])
    if published is None or published.digest != current[1]:
        return f"the current Catalog revision {current[0]} is not published with its digest"
    return None


async def read_facts(tx: SqlTx, command: Command, *,
                     current_catalog: tuple[int, str] | None = None,
                     with_pins: bool = True) -> FactsRead:
    """Everything the table needs of ``command``, read in the caller's transaction."""
    attempts = await attempts_of(tx, command.command_id)
    live = await tx.fetchall(
        "SELECT COUNT(*) FROM work_items WHERE subject_kind = 'command' AND subject_id = ?"
        f" AND state NOT IN {in_states(TERMINAL)}", (command.command_id,))
    repaired_by = await repair_of(tx, command.command_id)
    superseded = await superseded_by(tx, command)
    pins = await _pins_moved(tx, command, current_catalog) if with_pins else None
    facts = CommandFacts(
        settlement=command.settlement.value,
        repaired=repaired_by is not None,
        live_work=bool(int(live[0][0])),
        unresolved=any(a.unresolved for a in attempts),
        applied=any(a.outcome == "ACCEPTED" or a.disposition in ("proven_applied",
                                                                   "operator_applied")
                    for a in attempts),
        no_effect_proven=await lineage_no_effect(tx, command) is not None,
        remote_id_pinned=command.remote_id is not None,
        superseded=superseded is not None,
        pins_moved=pins is not None,
    )
    return FactsRead(command, facts, repaired_by, superseded, pins)


async def decide(tx: SqlTx, command_id: str, action: Action, *,
                 current_catalog: tuple[int, str] | None = None,
                 with_pins: bool = True) -> tuple[Allowed, FactsRead]:
    """Lock the command, read its facts and ask the table; raise :class:`ActionRefused`."""
    command = await lock_command(tx, command_id)
    read = await read_facts(tx, command, current_catalog=current_catalog,
                            with_pins=with_pins)
    found = verdict(read.facts, action)
    if isinstance(found, Refused):
        raise ActionRefused(command_id, action, found, read.detail(found.code))
    return found, read


class CommandOperator:
    """The console's and the CLI's read of a command's operator path."""

    db: Database

    async def command_operator_path(self, command_id: str,
                                    current_catalog: tuple[int, str] | None
                                    ) -> FactsRead | None:
        """The command's effect state and the one action that leads to its receipt."""

        async def body(tx: SqlTx) -> FactsRead | None:
            command = await read_command(tx, command_id)
            if command is None:
                return None
            return await read_facts(tx, command, current_catalog=current_catalog)

        return await self.db.transact(body, name="command.operator_path", write=False)
