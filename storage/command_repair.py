"""Operator repair of commands (seed 10): retire one, or issue a new one with lineage.

Theory of operation
-------------------
Repairs never edit history: attempts keep their request and classification,
and a repair command is a *new* command (``repair_of`` lineage) with its own
WorkItem. Both are audited in their own transaction, and each is decided in
it by the operator-path table (:mod:`daemon.core.operator_paths`, applied by
:mod:`storage.command_operator`, which first takes the command's row):

* neither runs while an attempt is unresolved (record a disposition first)
  or while the command still has live work (its result settles it);
* **retire** settles what the lineage's whole history proves, computed here,
  in the retiring transaction: an attempt proven applied settles the exact
  success result with the pinned remote id (also for a command retired before
  this rule), a proof of no effect settles ``NO_EFFECT``; both queue the
  Runtime receipt. Otherwise the command is retired without a receipt and its
  Runtime intent keeps blocking, visibly, until a repair command answers it;
* **repair** is refused when the command is settled, when an attempt is
  proven applied (retire settles it: a second call could only repeat the
  effect), when it was already repaired (at most one repair per command: a
  unique key), or when a newer intent for the same record and field exists
  (a replay of the older value would overwrite it). The repair command answers
  the original Runtime intent: its exact success result (or a no-effect result
  the whole lineage proves) becomes the original's receipt
  (:mod:`storage.repair_lineage`).
"""

from __future__ import annotations

import json

import attrs

from daemon.core.handoff import NoEffectResult
from daemon.core.operator_paths import Action, Receipt
from storage.catalog_revisions import read_revision
from storage.command_operator import decide
from storage.commands import _insert_command, read_command
from storage.effect_values import Command, CommandDraft, Settlement
from storage.effects import settle
from storage.idgen import new_ulid
from storage.port import AuditEntry, Database, DuplicateKey, SqlTx, WorkConflict
from storage.repair_lineage import lineage_no_effect, lineage_of, repair_of
from storage.supersede import superseded_by
from storage.work_admin import append_audit


@attrs.frozen(kw_only=True)
class RepairActor:
    actor: str
    role: str
    reason: str


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
        """Stop a blocked command for good, settling what its lineage proves:
        ``succeeded`` (an attempt proven applied; the exact success receipt),
        ``no_effect`` (its receipt), else ``retired`` without a receipt (the
        Runtime intent keeps blocking until a repair command answers it)."""

        async def body(tx: SqlTx) -> Settlement:
            allowed, read = await decide(tx, command_id, Action.RETIRE, with_pins=False)
            command = read.command
            after: dict[str, str | int] = {}
            if allowed.receipt is Receipt.SUCCESS:
                assert command.remote_id is not None  # the table refuses without one
                await settle(tx, command_id=command_id, command=command,
                             settlement=Settlement.SUCCEEDED, result_format_version=1,
                             remote_id=command.remote_id, canonical_result="",
                             result_digest="", receipt_max_attempts=receipt_max_attempts,
                             now_us=now_us, expected=command.settlement)
                outcome = Settlement.SUCCEEDED
                after["remote_id"] = command.remote_id
            elif allowed.receipt is Receipt.NO_EFFECT:
                reason = await lineage_no_effect(tx, command)
                assert reason is not None  # the table allows it only with the proof
                result = NoEffectResult(reason)
                await settle(tx, command_id=command_id, command=command,
                             settlement=Settlement.NO_EFFECT, result_format_version=2,
                             remote_id="", canonical_result=result.canonical.decode(),
                             result_digest=result.digest,
                             receipt_max_attempts=receipt_max_attempts, now_us=now_us)
                outcome = Settlement.NO_EFFECT
                after["no_effect_reason"] = reason.value
            else:
                await _retire(tx, command_id, now_us)
                outcome = Settlement.RETIRED
            await _audit(tx, who, "command.retire", command_id,
                         {"settlement": command.settlement.value},
                         {**after, "settlement": outcome.value}, now_us)
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
            _, read = await decide(tx, command_id, Action.REPAIR, with_pins=False)
            old = read.command
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
