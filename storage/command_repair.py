"""Operator repair of commands (seed 10): retire one, or issue a new one with lineage.

Repairs never edit history: attempts keep their request and classification,
a retired command stays retired, and a repair command is a *new* command
(``repair_of`` lineage) with its own WorkItem. Both refuse while an attempt
is unresolved (record a disposition first) or while the command still has
live work (cancel it first), and both are audited in their own transaction.
"""

from __future__ import annotations

import json

import attrs

from daemon.core.states import TERMINAL
from storage.catalog_revisions import read_revision
from storage.commands import _insert_command, read_command
from storage.effect_values import Command, CommandDraft, Settlement
from storage.effects import attempts_of, settle
from storage.idgen import new_ulid
from storage.port import AuditEntry, Database, SqlTx, WorkConflict, WorkNotFound
from storage.work_admin import append_audit
from storage.work_rows import in_states


@attrs.frozen(kw_only=True)
class RepairActor:
    actor: str
    role: str
    reason: str


async def _repairable(tx: SqlTx, command_id: str) -> Command:
    command = await read_command(tx, command_id)
    if command is None:
        raise WorkNotFound(command_id)
    if any(a.unresolved for a in await attempts_of(tx, command_id)):
        raise WorkConflict(f"command {command_id} has an attempt with an unknown outcome:"
                           " record a disposition first")
    live = await tx.fetchall(
        "SELECT COUNT(*) FROM work_items WHERE subject_kind = 'command' AND subject_id = ?"
        f" AND state NOT IN {in_states(TERMINAL)}",
        (command_id,),
    )
    if int(live[0][0]):
        raise WorkConflict(f"command {command_id} still has live work: cancel it first")
    return command


async def _audit(tx: SqlTx, who: RepairActor, action: str, command_id: str,
                 before: dict[str, str | int], after: dict[str, str | int],
                 now_us: int) -> None:
    await append_audit(tx, AuditEntry(
        audit_id=new_ulid(now_us), at_us=now_us, actor=who.actor, role=who.role, action=action,
        target_kind="external_command", target_id=command_id, reason=who.reason,
        before=json.dumps(before), after=json.dumps(after),
    ))


class CommandRepair:
    db: Database

    async def command_retire(self, command_id: str, who: RepairActor, *,
                             no_effect: tuple[str, str] | None, receipt_max_attempts: int,
                             now_us: int) -> Settlement:
        """Stop a blocked command for good. With ``no_effect`` (canonical result and
        digest, when the history proves no effect) the Runtime gets that result;
        otherwise the command is retired without a receipt."""

        async def body(tx: SqlTx) -> Settlement:
            command = await _repairable(tx, command_id)
            if command.settlement is not Settlement.OPEN:
                raise WorkConflict(f"command {command_id} is already {command.settlement.value}")
            if no_effect is not None:
                await settle(tx, command_id=command_id, command=command,
                             settlement=Settlement.NO_EFFECT, result_format_version=2,
                             remote_id="", canonical_result=no_effect[0],
                             result_digest=no_effect[1],
                             receipt_max_attempts=receipt_max_attempts, now_us=now_us)
                outcome = Settlement.NO_EFFECT
            else:
                await tx.execute(
                    "UPDATE external_commands SET settlement = 'retired', updated_at_us = ?"
                    " WHERE command_id = ? AND settlement = 'open'", (now_us, command_id))
                outcome = Settlement.RETIRED
            await _audit(tx, who, "command.retire", command_id,
                         {"settlement": command.settlement.value},
                         {"settlement": outcome.value}, now_us)
            return outcome

        return await self.db.transact(body, name="command.retire")

    async def command_repair(self, command_id: str, who: RepairActor, *,
                             binding_generation: int, catalog_revision: int,
                             catalog_digest: str, max_attempts: int, now_us: int,
                             link_key: str = "") -> str:
        """A new command with repair lineage, pinned to the *current* binding
        generation, the Catalog revision the caller resolved as current (it must be
        published with that digest), and the remote link at ``link_key`` (default:
        the old command's) as it is now; the old one is retired if it was still open.
        The audit entry records both revisions."""

        async def body(tx: SqlTx) -> str:
            old = await _repairable(tx, command_id)
            if old.settlement is Settlement.SUCCEEDED:
                raise WorkConflict(f"command {command_id} succeeded; nothing to repair")
            resolved = await read_revision(tx, catalog_revision)
            if resolved is None or resolved.digest != catalog_digest:
                raise WorkConflict(
                    f"the current Catalog revision {catalog_revision} is not published with"
                    f" digest {catalog_digest}: publish it first (integrationd catalog publish)")
            if old.settlement is Settlement.OPEN:
                await tx.execute(
                    "UPDATE external_commands SET settlement = 'retired', updated_at_us = ?"
                    " WHERE command_id = ? AND settlement = 'open'", (now_us, command_id))
            new_id = new_ulid(now_us)
            draft = CommandDraft(
                scope=old.scope, runtime_name=old.runtime_name, handoff_key="",
                payload_digest=old.payload_digest, runtime_outbox_id=old.runtime_outbox_id,
                intent_id=old.intent_id, intent_kind=old.intent_kind, operation=old.operation,
                local_object=old.local_object, local_id=old.local_id,
                binding_id=old.binding_id, binding_generation=binding_generation,
                catalog_revision=catalog_revision, catalog_digest=catalog_digest,
                frozen_request=old.frozen_request, max_attempts=max_attempts,
                lane=f"{old.scope.org_id}:{old.local_object}:{old.local_id}",
                link_key=link_key or old.link_key or "",
            )
            await _insert_command(tx, draft, new_id, now_us, repair_of=command_id)
            await _audit(tx, who, "command.repair", command_id,
                         {"command_id": command_id, "settlement": old.settlement.value,
                          "catalog_revision": old.catalog_revision,
                          "catalog_digest": old.catalog_digest},
                         {"command_id": new_id, "repair_of": command_id,
                          "catalog_revision": catalog_revision,
                          "catalog_digest": catalog_digest}, now_us)
            return new_id

        return await self.db.transact(body, name="command.repair")
