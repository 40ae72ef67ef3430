"""Operator repair of commands (seed 10): retire one, or issue a new one with lineage.

Theory of operation
-------------------
Repairs never edit history: attempts keep their request and classification,
a retired command stays retired, and a repair command is a *new* command
(``repair_of`` lineage) with its own WorkItem. Both are audited in their own
transaction, and every check below is made inside that transaction:

* neither runs while an attempt is unresolved (record a disposition first)
  or while the command still has live work (cancel it first);
* **retire** settles the command with a no-effect result, and queues the
  Runtime receipt, only when the lineage's whole history proves no effect
  (computed here, in the retiring transaction); otherwise the command is
  retired without a receipt and its Runtime intent keeps blocking, visibly;
* **repair** is refused when the command is settled (a success or a
  no-effect result was persisted), when an attempt is proven applied (settle
  it by replaying its work item instead: a second call could only repeat the
  effect), when it was already repaired (at most one repair per command: a
  unique key), or when a newer intent for the same record and field already
  landed (a replay of the older value would overwrite it). The repair
  command answers the original Runtime intent: its exact success result (or a
  no-effect result the whole lineage proves) becomes the original's receipt
  (:mod:`storage.repair_lineage`).
"""

from __future__ import annotations

import json

import attrs

from daemon.core.handoff import NoEffectResult
from daemon.core.states import TERMINAL
from storage.catalog_revisions import read_revision
from storage.commands import _insert_command, read_command
from storage.effect_values import APPLIED_DISPOSITIONS, Command, CommandDraft, Settlement
from storage.effects import attempts_of, settle
from storage.idgen import new_ulid
from storage.port import (
    AuditEntry,
    Database,
    DuplicateKey,
    SqlTx,
    WorkConflict,
    WorkNotFound,
)
from storage.repair_lineage import lineage_no_effect, lineage_of, repair_of
from storage.supersede import superseded_by
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


async def _link_key_of(tx: SqlTx, command_id: str) -> str:
    """The remote-link key admission put in the command's work payload ("" if none):
    the repair's WorkItem carries it too, so it takes the same target lane."""
    rows = await tx.fetchall(
        "SELECT payload FROM work_items WHERE subject_kind = 'command' AND subject_id = ?"
        " ORDER BY work_id", (command_id,))
    for (payload,) in rows:
        try:
            key = json.loads(str(payload)).get("link_key")
        except (ValueError, AttributeError):
            continue
        if isinstance(key, str) and key:
            return key
    return ""


async def _retire(tx: SqlTx, command_id: str, now_us: int) -> None:
    await tx.execute(
        "UPDATE external_commands SET settlement = 'retired', updated_at_us = ?"
        " WHERE command_id = ? AND settlement = 'open'", (now_us, command_id))


class CommandRepair:
    db: Database

    async def command_retire(self, command_id: str, who: RepairActor, *,
                             receipt_max_attempts: int, now_us: int) -> Settlement:
        """Stop a blocked command for good: ``no_effect`` (with the Runtime's
        receipt) when the lineage's history proves it, else ``retired``
        without a receipt (the Runtime intent keeps blocking)."""

        async def body(tx: SqlTx) -> Settlement:
            command = await _repairable(tx, command_id)
            if command.settlement is not Settlement.OPEN:
                raise WorkConflict(f"command {command_id} is already {command.settlement.value}")
            reason = await lineage_no_effect(tx, command)
            if reason is not None:
                result = NoEffectResult(reason)
                await settle(tx, command_id=command_id, command=command,
                             settlement=Settlement.NO_EFFECT, result_format_version=2,
                             remote_id="", canonical_result=result.canonical.decode(),
                             result_digest=result.digest,
                             receipt_max_attempts=receipt_max_attempts, now_us=now_us)
                outcome = Settlement.NO_EFFECT
            else:
                await _retire(tx, command_id, now_us)
                outcome = Settlement.RETIRED
            after: dict[str, str | int] = {"settlement": outcome.value}
            if reason is not None:
                after["no_effect_reason"] = reason.value
            await _audit(tx, who, "command.retire", command_id,
                         {"settlement": command.settlement.value}, after, now_us)
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
            if old.settlement in (Settlement.SUCCEEDED, Settlement.NO_EFFECT):
                raise WorkConflict(f"command {command_id} is settled"
                                   f" ({old.settlement.value}); nothing to repair")
            if any(a.outcome == "ACCEPTED" or a.disposition in APPLIED_DISPOSITIONS
                   for a in await attempts_of(tx, command_id)):
                raise WorkConflict(f"command {command_id}'s effect is proven applied: replay"
                                   " its work item to settle it (a repair would repeat it)")
            existing = await repair_of(tx, command_id)
            if existing is not None:
                raise WorkConflict(f"command {command_id} was already repaired by {existing}")
            newer = await superseded_by(tx, old)
            if newer is not None:
                raise WorkConflict(f"command {command_id} is superseded: {newer}")
            resolved = await read_revision(tx, catalog_revision)
            if resolved is None or resolved.digest != catalog_digest:
                raise WorkConflict(
                    f"the current Catalog revision {catalog_revision} is not published with"
                    f" digest {catalog_digest}: publish it first (integrationd catalog publish)")
            if old.settlement is Settlement.OPEN:
                await _retire(tx, command_id, now_us)
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
                link_key=link_key or await _link_key_of(tx, command_id),
            )
            try:
                await _insert_command(tx, draft, new_id, now_us, repair_of=command_id)
            except DuplicateKey:  # a racing repair of the same command won
                raise WorkConflict(f"command {command_id} was already repaired") from None
            await _audit(tx, who, "command.repair", command_id,
                         {"command_id": command_id, "settlement": old.settlement.value,
                          "catalog_revision": old.catalog_revision,
                          "catalog_digest": old.catalog_digest},
                         {"command_id": new_id, "repair_of": command_id,
                          "catalog_revision": catalog_revision,
                          "catalog_digest": catalog_digest}, now_us)
            return new_id

        return await self.db.transact(body, name="command.repair")

    async def command_superseded(self, command_id: str) -> str | None:
        """Why replaying ``command_id`` would overwrite a newer intent that landed (or None)."""

        async def body(tx: SqlTx) -> str | None:
            command = await read_command(tx, command_id)
            return None if command is None else await superseded_by(tx, command)

        return await self.db.transact(body, name="command.superseded", write=False)

    async def command_repaired_by(self, command_id: str) -> str | None:
        """The repair command issued for ``command_id``, if any (at most one)."""

        async def body(tx: SqlTx) -> str | None:
            return await repair_of(tx, command_id)

        return await self.db.transact(body, name="command.repaired_by", write=False)

    async def command_lineage(self, command_id: str) -> list[Command]:
        """The command's repair lineage, root (the handed-off command) first."""

        async def body(tx: SqlTx) -> list[Command]:
            command = await read_command(tx, command_id)
            return [] if command is None else await lineage_of(tx, command)

        return await self.db.transact(body, name="command.lineage", write=False)
