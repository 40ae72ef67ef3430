"""The command inbox and its Runtime-handoff fence (seed 6.1).

Theory of operation
-------------------
``handoff_admissions`` holds at most one terminal admission fact per
``EffectHandoffKey`` (its primary key): ``COMMAND_ACCEPTED`` with the command
id, or ``HANDOFF_REJECTED`` with a versioned receipt. Acceptance writes the
fact, the ``ExternalCommand`` and the command's one WorkItem in one
transaction; ``RejectIfUnaccepted`` writes the tombstone. Both first read the
key; when they race, the unique key decides: the loser's INSERT fails, it
re-reads the winner's fact and answers from it. So an acceptance racing a
rejection yields exactly one outcome, and a late delivery after a rejection
can never create a command or WorkItem.

Every command is pinned to the Catalog revision *and* digest it was admitted
under (``catalog_revision``, ``catalog_digest``; the caller resolved both from
a published revision, ``daemon/services/catalog_view.py``), and so is its
WorkItem: dispatch, retries, reconciliation and replay run against exactly
that revision's stored definitions.

A request whose payload digest or Runtime outbox identity differs from the
stored fact (also when its body fails validation) is *quarantined*: recorded
in ``handoff_quarantine`` as evidence, answered with no admission detail, and
it changes nothing else. Scope checks
happen before storage is touched (the key encodes the complete scope and is
compared with the authenticated caller's).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import attrs

from daemon.core.canonical import canonical_bytes
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.work import WorkSpec
from storage.effect_values import (
    Admission,
    AdmissionResult,
    Command,
    CommandDraft,
    Settlement,
)
from storage.history import EFFECT_FAMILY as EFFECT_FAMILY  # re-exported: its home is here
from storage.history_flow import count_accepted
from storage.idgen import new_ulid
from storage.port import Database, DuplicateKey, Row, SqlTx
from storage.work_admin import insert_work
from storage.work_rows import placeholders

T = TypeVar("T")

RECEIPT_VERSION = 1

_ADMISSION_COLUMNS = (
    "org_id, app_installation_id, runtime_capability_id, runtime_work_binding_digest,"
    " payload_digest, runtime_outbox_id, admission, command_id, receipt_json"
)
_INSERT_ACCEPTED = (
    "INSERT INTO handoff_admissions (handoff_key, org_id, app_installation_id,"
    " runtime_capability_id, runtime_work_binding_digest, payload_digest, runtime_outbox_id,"
    " admission, command_id, receipt_json, created_at_us)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, 'COMMAND_ACCEPTED', ?, NULL, ?)"
)
COMMAND_COLUMNS = (
    "command_id, handoff_key, org_id, app_installation_id, runtime_capability_id,"
    " runtime_work_binding_digest, runtime_name, intent_id, intent_kind, operation,"
    " local_object, local_id, binding_id, principal_generation, catalog_revision,"
    " frozen_request, payload_digest, runtime_outbox_id, settlement, repair_of, created_at_us,"
    " catalog_digest, link_key, link_generation, remote_id"
)


def command_from_row(row: Row) -> Command:
    return Command(
        command_id=str(row[0]),
        handoff_key=row[1],
        scope=TrustedRuntimeWorkScope(str(row[2]), str(row[3]), str(row[4]), str(row[5])),
        runtime_name=str(row[6]),
        intent_id=str(row[7]),
        intent_kind=str(row[8]),
        operation=str(row[9]),
        local_object=str(row[10]),
        local_id=str(row[11]),
        binding_id=str(row[12]),
        binding_generation=None if row[13] is None else int(row[13]),
        catalog_revision=int(row[14]),
        frozen_request=str(row[15]),
        payload_digest=str(row[16]),
        runtime_outbox_id=str(row[17]),
        settlement=Settlement(row[18]),
        repair_of=row[19],
        created_at_us=int(row[20]),
        catalog_digest=str(row[21]),
        link_key=None if row[22] is None else str(row[22]),
        link_generation=None if row[23] is None else int(row[23]),
        remote_id=None if row[24] is None else str(row[24]),
    )


async def read_command(tx: SqlTx, command_id: str) -> Command | None:
    rows = await tx.fetchall(
        f"SELECT {COMMAND_COLUMNS} FROM external_commands WHERE command_id = ?", (command_id,)
    )
    return command_from_row(rows[0]) if rows else None


def _scope_of(row: Row) -> TrustedRuntimeWorkScope:
    return TrustedRuntimeWorkScope(str(row[0]), str(row[1]), str(row[2]), str(row[3]))


class CommandInbox:
    db: Database

    async def _admission_row(self, tx: SqlTx, key: str) -> Row | None:
        rows = await tx.fetchall(
            f"SELECT {_ADMISSION_COLUMNS} FROM handoff_admissions WHERE handoff_key = ?", (key,)
        )
        return rows[0] if rows else None

    async def _answer_existing(
        self,
        tx: SqlTx,
        row: Row,
        *,
        key: str,
        scope: TrustedRuntimeWorkScope,
        runtime_name: str,
        payload_digest: str,
        outbox_id: str,
        now_us: int,
    ) -> AdmissionResult:
        reason = ""
        if _scope_of(row) != scope:
            reason = "scope_mismatch"  # unreachable while the key encodes the scope
        elif row[4] != payload_digest:
            reason = "payload_digest_mismatch"
        elif row[5] != outbox_id:
            reason = "runtime_outbox_mismatch"
        if reason:
            await tx.execute(
                "INSERT INTO handoff_quarantine (quarantine_id, handoff_key, runtime_name,"
                " reason, presented_payload_digest, presented_outbox_id, at_us)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (new_ulid(now_us), key, runtime_name, reason, payload_digest[:80],
                 outbox_id[:255], now_us),
            )
            return AdmissionResult(Admission.QUARANTINED, reason=reason)
        if row[6] == Admission.COMMAND_ACCEPTED:
            return AdmissionResult(Admission.COMMAND_ACCEPTED, command_id=str(row[7]))
        return AdmissionResult(Admission.HANDOFF_REJECTED, receipt=str(row[8]))

    async def command_accept(self, draft: CommandDraft, now_us: int) -> AdmissionResult:
        """Accept a command exactly once, or answer from the existing admission fact."""

        async def body(tx: SqlTx) -> AdmissionResult:
            return await self._accept_in(tx, draft, now_us)

        return await self._idempotent(body, "command.accept")

    async def _accept_in(self, tx: SqlTx, draft: CommandDraft, now_us: int) -> AdmissionResult:
        existing = await self._admission_row(tx, draft.handoff_key)
        if existing is None:
            command_id = new_ulid(now_us)
            try:
                await tx.execute(_INSERT_ACCEPTED, (
                    draft.handoff_key, *_scope_values(draft.scope), draft.payload_digest,
                    draft.runtime_outbox_id, command_id, now_us))
            except DuplicateKey:
                existing = await self._admission_row(tx, draft.handoff_key)
            else:
                (work_id,) = await _insert_commands(tx, [(draft, command_id)], now_us)
                return AdmissionResult(Admission.COMMAND_ACCEPTED, command_id=command_id,
                                       work_id=work_id, created=True)
        assert existing is not None
        return await self._answer_existing(
            tx, existing, key=draft.handoff_key, scope=draft.scope,
            runtime_name=draft.runtime_name, payload_digest=draft.payload_digest,
            outbox_id=draft.runtime_outbox_id, now_us=now_us,
        )

    async def command_accept_many(self, drafts: Sequence[CommandDraft],
                                  now_us: int) -> list[AdmissionResult]:
        """Accept a batch of commands in one transaction; one answer per draft, in order.

        Each answer is exactly what :meth:`command_accept` would give for that
        draft alone. The common case (fresh keys, none repeated) costs one read
        of the keys and one multi-row INSERT per table. Anything else (a key
        already admitted, repeated in the batch, or taken by a racing caller
        between the read and the INSERT) is answered one draft at a time inside
        the same transaction, through the single-command path.
        """
        if not drafts:
            return []

        async def body(tx: SqlTx) -> list[AdmissionResult]:
            keys = [d.handoff_key for d in drafts]
            if len(set(keys)) == len(keys) and not await self._any_admitted(tx, keys):
                ids = [new_ulid(now_us) for _ in drafts]
                try:
                    await tx.executemany(_INSERT_ACCEPTED, [
                        (d.handoff_key, *_scope_values(d.scope), d.payload_digest,
                         d.runtime_outbox_id, command_id, now_us)
                        for d, command_id in zip(drafts, ids, strict=True)
                    ])
                except DuplicateKey:
                    pass  # a racing caller took a key: the statement wrote nothing
                else:
                    work_ids = await _insert_commands(tx, list(zip(drafts, ids, strict=True)),
                                                      now_us)
                    return [AdmissionResult(Admission.COMMAND_ACCEPTED, command_id=c,
                                            work_id=w, created=True)
                            for c, w in zip(ids, work_ids, strict=True)]
            return [await self._accept_in(tx, d, now_us) for d in drafts]

        return await self._idempotent(body, "command.accept_many")

    async def _any_admitted(self, tx: SqlTx, keys: Sequence[str]) -> bool:
        rows = await tx.fetchall(
            f"SELECT 1 FROM handoff_admissions WHERE handoff_key IN ({placeholders(len(keys))})"
            " LIMIT 1",
            tuple(keys),
        )
        return bool(rows)

    async def command_reject_if_unaccepted(
        self,
        *,
        scope: TrustedRuntimeWorkScope,
        runtime_name: str,
        handoff_key: str,
        payload_digest: str,
        runtime_outbox_id: str,
        now_us: int,
        reason: str = "",
    ) -> AdmissionResult:
        """Return the accepted command, or write (or return) the rejection tombstone
        (with ``reason``, a stable code, when integrationd itself rejects the handoff)."""
        fields: dict[str, object] = {
            "admission": Admission.HANDOFF_REJECTED.value,
            "effect_handoff_key": handoff_key,
            "payload_digest": payload_digest,
            "receipt_version": RECEIPT_VERSION,
            "rejected_at_us": now_us,
            "runtime_outbox_id": runtime_outbox_id,
        }
        if reason:
            fields["reason"] = reason
        receipt = canonical_bytes(fields).decode()

        async def body(tx: SqlTx) -> AdmissionResult:
            existing = await self._admission_row(tx, handoff_key)
            if existing is None:
                try:
                    await tx.execute(
                        "INSERT INTO handoff_admissions (handoff_key, org_id,"
                        " app_installation_id, runtime_capability_id,"
                        " runtime_work_binding_digest, payload_digest, runtime_outbox_id,"
                        " admission, command_id, receipt_json, created_at_us)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, 'HANDOFF_REJECTED', NULL, ?, ?)",
                        (handoff_key, *_scope_values(scope), payload_digest, runtime_outbox_id,
                         receipt, now_us),
                    )
                except DuplicateKey:
                    existing = await self._admission_row(tx, handoff_key)
                else:
                    return AdmissionResult(Admission.HANDOFF_REJECTED, receipt=receipt,
                                           created=True)
            assert existing is not None
            return await self._answer_existing(
                tx, existing, key=handoff_key, scope=scope, runtime_name=runtime_name,
                payload_digest=payload_digest, outbox_id=runtime_outbox_id, now_us=now_us,
            )

        return await self._idempotent(body, "command.reject_if_unaccepted")

    async def command_quarantine_invalid(
        self,
        *,
        handoff_key: str,
        runtime_name: str,
        payload_digest: str,
        runtime_outbox_id: str,
        body_matches_digest: bool,
        reason: str,
        now_us: int,
    ) -> bool:
        """A request for an *admitted* key whose body failed validation: record it in
        ``handoff_quarantine`` when it conflicts with the stored fact (another
        digest or outbox identity, or a body that is not the one its digest names).
        True when recorded. A fresh key, or the admitted body itself, records nothing."""

        async def body(tx: SqlTx) -> bool:
            row = await self._admission_row(tx, handoff_key)
            if row is None:
                return False
            if row[4] == payload_digest and row[5] == runtime_outbox_id and body_matches_digest:
                return False
            await tx.execute(
                "INSERT INTO handoff_quarantine (quarantine_id, handoff_key, runtime_name,"
                " reason, presented_payload_digest, presented_outbox_id, at_us)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (new_ulid(now_us), handoff_key, runtime_name, reason[:64], payload_digest[:80],
                 runtime_outbox_id[:255], now_us),
            )
            return True

        return await self.db.transact(body, name="command.quarantine_invalid")

    async def _idempotent(self, body: Callable[[SqlTx], Awaitable[T]], name: str) -> T:
        # TiDB (optimistic) may report the racing INSERT's duplicate key only at
        # COMMIT; the whole body then runs again and answers from the winner.
        try:
            return await self.db.transact(body, name=name)
        except DuplicateKey:
            return await self.db.transact(body, name=name)

    async def admission_read(self, handoff_key: str) -> tuple[TrustedRuntimeWorkScope,
                                                                AdmissionResult] | None:
        """The stored admission fact (with its scope, for the caller to compare)."""

        async def body(tx: SqlTx) -> tuple[TrustedRuntimeWorkScope, AdmissionResult] | None:
            row = await self._admission_row(tx, handoff_key)
            if row is None:
                return None
            if row[6] == Admission.COMMAND_ACCEPTED:
                result = AdmissionResult(Admission.COMMAND_ACCEPTED, command_id=str(row[7]))
            else:
                result = AdmissionResult(Admission.HANDOFF_REJECTED, receipt=str(row[8]))
            return _scope_of(row), result

        return await self.db.transact(body, name="command.admission_read", write=False)

    async def command_get(self, command_id: str) -> Command | None:
        async def body(tx: SqlTx) -> Command | None:
            return await read_command(tx, command_id)

        return await self.db.transact(body, name="command.get", write=False)

    async def quarantine_count(self, handoff_key: str) -> int:
        async def body(tx: SqlTx) -> int:
            rows = await tx.fetchall(
                "SELECT COUNT(*) FROM handoff_quarantine WHERE handoff_key = ?", (handoff_key,)
            )
            return int(rows[0][0])

        return await self.db.transact(body, name="command.quarantine_count", write=False)


def _scope_values(scope: TrustedRuntimeWorkScope) -> tuple[str, str, str, str]:
    return (scope.org_id, scope.app_installation_id, scope.runtime_capability_id,
            scope.runtime_work_binding_digest)


async def _insert_command(tx: SqlTx, draft: CommandDraft, command_id: str, now_us: int,
                          repair_of: str | None = None) -> str:
    (work_id,) = await _insert_commands(tx, [(draft, command_id)], now_us, repair_of)
    return work_id


@attrs.frozen
class _LinkNow:
    """What a command pins of its link, and the lane it runs in, read at admission."""

    generation: int
    remote_id: str | None
    target_lane: str


async def _links_now(tx: SqlTx, keys: Sequence[str]) -> dict[str, _LinkNow]:
    """Each named link as it is now, in the admission's own transaction: one read.

    The pins are its generation and remote id. The target lane is the remote record
    the link names (seed 5.2): an active link's lane is its remote locator (provider
    scope, remote account, remote object and remote id, hashed), so two commands that
    write one remote record never run at once, whichever local record they come from;
    a link not yet active (a create slot) serializes on its own key. A key with no
    link yet is absent (no pins; its lane is its own key)."""
    wanted = sorted({k for k in keys if k})
    if not wanted:
        return {}
    rows = await tx.fetchall(
        "SELECT link_key, generation, remote_id, state, locator_hash FROM remote_links"
        f" WHERE link_key IN ({placeholders(len(wanted))})", wanted)
    return {str(r[0]): _LinkNow(
        generation=int(r[1]), remote_id=None if r[2] is None else str(r[2]),
        target_lane=f"remote:{r[4]}" if r[3] == "active" and r[4] else f"link:{r[0]}")
        for r in rows}


async def _insert_commands(tx: SqlTx, commands: Sequence[tuple[CommandDraft, str]],
                           now_us: int, repair_of: str | None = None) -> list[str]:
    """Insert the commands and their one WorkItem each; return the work ids in order.

    Each command pins the RemoteLink it targets as it is now (key, generation,
    remote id; no generation when there is no link yet), so a later rebind or
    reconnect cannot retarget it (seed 8.1)."""
    links = await _links_now(tx, [draft.link_key for draft, _ in commands])
    await tx.executemany(
        f"INSERT INTO external_commands ({COMMAND_COLUMNS}, binding_generation, updated_at_us)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'open', ?, ?,"
        " ?, ?, ?, ?, ?, ?)",
        [(command_id, draft.handoff_key or None, *_scope_values(draft.scope), draft.runtime_name,
          draft.intent_id, draft.intent_kind, draft.operation, draft.local_object,
          draft.local_id, draft.binding_id, draft.binding_generation, draft.catalog_revision,
          draft.frozen_request, draft.payload_digest, draft.runtime_outbox_id, repair_of,
          now_us, draft.catalog_digest, draft.link_key or None,
          *_pins(links.get(draft.link_key)),
          # The legacy column (the TOML generation it once held) gets the same value.
          draft.binding_generation, now_us)
         for draft, command_id in commands],
    )
    # The console's history counts the admissions in this same transaction.
    await count_accepted(tx, [(command_id, draft.scope.org_id, draft.binding_id,
                               draft.operation) for draft, command_id in commands], now_us)
    # The dedupe key is the new command's own id, so it cannot collide: the
    # WorkItems go in as one multi-row INSERT.
    works = await insert_work(
        tx,
        [WorkSpec(
            family=EFFECT_FAMILY,
            org_id=draft.scope.org_id,
            app_installation_id=draft.scope.app_installation_id,
            subject_kind="command",
            subject_id=command_id,
            definition_ref=draft.operation,
            catalog_revision=draft.catalog_revision,
            catalog_digest=draft.catalog_digest,
            payload=json.dumps({"command_id": command_id, "link_key": draft.link_key}
                               if draft.link_key else {"command_id": command_id}),
            source_lane=draft.lane,
            target_lane=_target_lane(draft.link_key, links),
            max_attempts=draft.max_attempts,
            dedupe_key=f"command:{command_id}",
        ) for draft, command_id in commands],
        now_us,
        fresh_dedupe_keys=True,
    )
    return [w.work_id for w in works]


def _pins(link: _LinkNow | None) -> tuple[int | None, str | None]:
    return (None, None) if link is None else (link.generation, link.remote_id)


def _target_lane(link_key: str, links: Mapping[str, _LinkNow]) -> str | None:
    if not link_key:
        return None
    link = links.get(link_key)
    return link.target_lane if link is not None else f"link:{link_key}"
