"""RemoteLink: the single owner of local <-> remote identity (seed 7, seed 003).

Transitions, each one conditional UPDATE or INSERT judged by matched rows:

* ``create``: a pending-create slot for a local record (no remote id yet);
* ``finalize``: pending-create -> active once the remote id is known;
* ``adopt``: bind a local record to an existing remote record (active at once);
* ``rebind``: point an active link at another remote record (generation + 1);
* ``retire``: active/pending -> retired (the remote record is free again);
* ``bind``: an operator's "this local record is that remote record": adopt or
  rebind as :func:`daemon.core.link_bind.decide_bind` decides from what its own
  transaction reads, or a refusal with a stable code (:class:`LinkRefused`).
  A rebind moves the generation, so commands pinned to the old one are refused at
  their dispatch checkpoint (``link_generation``) and never reach either record.

Uniqueness: the local side is the primary key (``IntegrationLinkKeyV2``); the
remote side is unique among *active* links through ``active_locator`` (the
``IntegrationRemoteLocatorHash`` while active, NULL otherwise), so one remote
record can never be linked to two local records. Expected generations make
rebind and retire compare-and-swap operations.
"""

from __future__ import annotations

import contextlib
import json

import attrs

from daemon.core.identity import (
    integration_link_key_v2,
    integration_remote_locator_hash,
    normalize_remote_id,
)
from daemon.core.link_bind import BindFacts, BindOutcome, BindRefusal, LinkFacts, decide_bind
from storage.effect_values import LinkState, RemoteLink
from storage.idgen import new_ulid
from storage.port import AuditEntry, Database, DuplicateKey, Row, SqlTx, WorkConflict
from storage.work_admin import append_audit

LINK_COLUMNS = (
    "link_key, scope_digest, local_object, local_id, remote_object, remote_id, locator_hash,"
    " state, generation, updated_at_us"
)


def link_select(alias: str = "") -> str:
    """The columns a link is read with: :data:`LINK_COLUMNS` (qualified by ``alias``)
    and the record's last-modified time as our latest accepted change on this
    generation and remote id left it (migration 0035: each settled command keeps the
    time its answer named; the newest of them, one lookup in the
    ``external_commands_link_modified`` index). A new generation (a rebind, another
    record) has no commands yet: nothing is known of the record."""
    a = f"{alias}." if alias else ""
    columns = ", ".join(f"{a}{c.strip()}" for c in LINK_COLUMNS.split(","))
    table = alias or "remote_links"
    return (f"{columns}, (SELECT MAX(m.modified_at_us) FROM external_commands m"
            f" WHERE m.link_key = {table}.link_key AND m.link_generation = {table}.generation"
            f" AND m.remote_id = {table}.remote_id)")


def link_from_row(row: Row) -> RemoteLink:
    return RemoteLink(
        link_key=str(row[0]), scope_digest=str(row[1]), local_object=str(row[2]),
        local_id=str(row[3]), remote_object=row[4], remote_id=row[5], locator_hash=row[6],
        state=LinkState(row[7]), generation=int(row[8]), updated_at_us=int(row[9]),
        modified_at_us=None if len(row) < 11 or row[10] is None else int(row[10]),
    )


class LinkRefused(WorkConflict):
    """An operator's bind refused with a stable ``code`` and a ``sentence``; nothing was
    written."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(f"{code}: {sentence}")
        self.code = code
        self.sentence = sentence


@attrs.frozen
class LinkBound:
    """What a bind did: the link now, how it got there, and the link before it."""

    link: RemoteLink
    outcome: BindOutcome
    before: RemoteLink | None


async def read_link(tx: SqlTx, link_key: str) -> RemoteLink | None:
    rows = await tx.fetchall(f"SELECT {link_select()} FROM remote_links WHERE link_key = ?",
                             (link_key,))
    return link_from_row(rows[0]) if rows else None


class RemoteLinks:
    db: Database

    async def link_get(self, scope_digest: str, local_object: str,
                       local_id: str) -> RemoteLink | None:
        key = integration_link_key_v2(scope_digest, local_object, local_id)

        async def body(tx: SqlTx) -> RemoteLink | None:
            return await read_link(tx, key)

        return await self.db.transact(body, name="link.get", write=False)

    async def link_create(self, scope_digest: str, local_object: str, local_id: str,
                          now_us: int) -> RemoteLink:
        """A pending-create slot (idempotent for the same local record)."""
        key = integration_link_key_v2(scope_digest, local_object, local_id)

        async def body(tx: SqlTx) -> RemoteLink:
            # If the slot (or a link) already exists, answer with it.
            with contextlib.suppress(DuplicateKey):
                await tx.execute(
                    f"INSERT INTO remote_links ({LINK_COLUMNS}, active_locator, created_at_us)"
                    " VALUES (?, ?, ?, ?, NULL, NULL, NULL, 'pending_create', 1, ?, NULL, ?)",
                    (key, scope_digest, local_object, local_id, now_us, now_us),
                )
            link = await read_link(tx, key)
            assert link is not None
            return link

        return await self.db.transact(body, name="link.create")

    async def link_finalize(self, link_key: str, remote_object: str, remote_id: str,
                            now_us: int) -> RemoteLink:
        """pending_create -> active with the remote id the provider assigned."""

        async def body(tx: SqlTx) -> RemoteLink:
            link = await read_link(tx, link_key)
            if link is None:
                raise WorkConflict(f"no remote link {link_key}")
            locator = integration_remote_locator_hash(link.scope_digest, remote_object, remote_id)
            if link.state is LinkState.ACTIVE and link.locator_hash == locator:
                return link  # the same finalize again
            await _activate(tx, link_key, "pending_create", link.generation, remote_object,
                            normalize_remote_id(remote_id), locator, link.generation, now_us)
            done = await read_link(tx, link_key)
            assert done is not None
            return done

        return await self.db.transact(body, name="link.finalize")

    async def link_adopt(
        self, scope_digest: str, local_object: str, local_id: str, remote_object: str,
        remote_id: str, *, actor: str, role: str, reason: str, now_us: int,
    ) -> RemoteLink:
        """Bind a local record to an existing remote record, after uniqueness checks."""
        async def body(tx: SqlTx) -> RemoteLink:
            return await adopt_link(tx, scope_digest, local_object, local_id, remote_object,
                                    remote_id, actor=actor, role=role, reason=reason,
                                    now_us=now_us)

        return await self.db.transact(body, name="link.adopt")

    async def link_rebind(
        self, link_key: str, remote_object: str, remote_id: str, *, expected_generation: int,
        actor: str, role: str, reason: str, now_us: int,
    ) -> RemoteLink:
        async def body(tx: SqlTx) -> RemoteLink:
            before = await read_link(tx, link_key)
            if before is None or before.state is not LinkState.ACTIVE:
                raise WorkConflict(f"link {link_key} is not active")
            locator = integration_remote_locator_hash(before.scope_digest, remote_object,
                                                      remote_id)
            try:
                await _activate(tx, link_key, "active", expected_generation, remote_object,
                                normalize_remote_id(remote_id), locator,
                                expected_generation + 1, now_us)
            except DuplicateKey:
                raise WorkConflict(
                    f"remote {remote_object} is already linked to another local record"
                ) from None
            after = await read_link(tx, link_key)
            assert after is not None
            await _audit(tx, "link.rebind", after, actor, role, reason, before, now_us)
            return after

        return await self.db.transact(body, name="link.rebind")

    async def link_bind(
        self, scope_digest: str, local_object: str, local_id: str, remote_object: str,
        remote_id: str, *, expected_generation: int | None, actor: str, role: str,
        reason: str, now_us: int,
    ) -> LinkBound:
        """An operator's bind (see :func:`bind_link`), in its own transaction."""

        async def body(tx: SqlTx) -> LinkBound:
            return await bind_link(tx, scope_digest, local_object, local_id, remote_object,
                                   remote_id, expected_generation=expected_generation,
                                   actor=actor, role=role, reason=reason, now_us=now_us)

        return await self.db.transact(body, name="link.bind")

    async def link_retire(self, link_key: str, *, expected_generation: int, actor: str,
                          role: str, reason: str, now_us: int) -> RemoteLink:
        async def body(tx: SqlTx) -> RemoteLink:
            return await retire_link(tx, link_key, expected_generation=expected_generation,
                                     actor=actor, role=role, reason=reason, now_us=now_us)

        return await self.db.transact(body, name="link.retire")


async def read_link_by_locator(tx: SqlTx, locator_hash: str) -> RemoteLink | None:
    """The active link of one remote record (unique among active links), or None."""
    rows = await tx.fetchall(
        f"SELECT {link_select()} FROM remote_links WHERE active_locator = ?", (locator_hash,))
    return link_from_row(rows[0]) if rows else None


async def adopt_link(
    tx: SqlTx, scope_digest: str, local_object: str, local_id: str, remote_object: str,
    remote_id: str, *, actor: str, role: str, reason: str, now_us: int,
) -> RemoteLink:
    """Bind a local record to an existing remote record inside ``tx`` (a fenced handler's
    transaction, or :meth:`RemoteLinks.link_adopt`'s own), after uniqueness checks; audited."""
    key = integration_link_key_v2(scope_digest, local_object, local_id)
    locator = integration_remote_locator_hash(scope_digest, remote_object, remote_id)
    normalized = normalize_remote_id(remote_id)
    existing = await read_link(tx, key)
    if existing is not None and existing.state is not LinkState.RETIRED:
        if existing.state is LinkState.ACTIVE and existing.locator_hash == locator:
            return existing  # adopting the same pair again
        raise WorkConflict(
            f"{local_object} {local_id} is already linked ({existing.state.value});"
            " rebind or retire it first"
        )
    try:
        if existing is None:
            await tx.execute(
                f"INSERT INTO remote_links ({LINK_COLUMNS}, active_locator,"
                " created_at_us) VALUES (?, ?, ?, ?, ?, ?, ?, 'active', 1, ?, ?, ?)",
                (key, scope_digest, local_object, local_id, remote_object, normalized,
                 locator, now_us, locator, now_us),
            )
        else:
            await _activate(tx, key, "retired", existing.generation, remote_object,
                            normalized, locator, existing.generation + 1, now_us)
    except DuplicateKey:
        raise WorkConflict(
            f"remote {remote_object} is already linked to another local record"
        ) from None
    link = await read_link(tx, key)
    assert link is not None
    await _audit(tx, "link.adopt", link, actor, role, reason, None, now_us)
    return link


# Effect attempts of commands pinned to one link generation with no proven outcome (in
# flight under a live claim, left without one, or OUTCOME_UNKNOWN), undisposed.
_UNRESOLVED_ON_GENERATION = (
    "SELECT COUNT(*) FROM effect_attempts a JOIN external_commands c"
    " ON c.command_id = a.command_id WHERE c.link_key = ? AND c.link_generation = ?"
    " AND a.disposition IS NULL AND (a.outcome IS NULL OR a.outcome = 'OUTCOME_UNKNOWN')"
)


async def bind_link(
    tx: SqlTx, scope_digest: str, local_object: str, local_id: str, remote_object: str,
    remote_id: str, *, expected_generation: int | None, actor: str, role: str, reason: str,
    now_us: int,
) -> LinkBound:
    """Bind a local record to an existing remote record inside ``tx``: adopt it, rebind
    the local record's active link to it (generation + 1), or nothing when it is bound
    already; audited as ``link.bind`` with the link before and after. A refusal
    (:class:`LinkRefused`) writes nothing. Raises ``BadCoordinate`` for ids that are not
    valid coordinates."""
    key = integration_link_key_v2(scope_digest, local_object, local_id)
    locator = integration_remote_locator_hash(scope_digest, remote_object, remote_id)
    normalized = normalize_remote_id(remote_id)
    before = await read_link(tx, key)
    holder = await read_link_by_locator(tx, locator)
    unresolved = 0
    if before is not None and before.state is LinkState.ACTIVE:
        rows = await tx.fetchall(_UNRESOLVED_ON_GENERATION, (key, before.generation))
        unresolved = int(str(rows[0][0]))
    decision = decide_bind(BindFacts(
        link=None if before is None else LinkFacts(
            state=before.state.value, generation=before.generation,
            locator_hash=before.locator_hash),
        locator_hash=locator, holder_key=None if holder is None else holder.link_key,
        own_key=key, expected_generation=expected_generation, unresolved_attempts=unresolved))
    if isinstance(decision, BindRefusal):
        raise LinkRefused(decision.code, decision.sentence)
    if decision is BindOutcome.UNCHANGED:
        assert before is not None
        return LinkBound(before, decision, before)
    try:
        if before is None:
            await tx.execute(
                f"INSERT INTO remote_links ({LINK_COLUMNS}, active_locator,"
                " created_at_us) VALUES (?, ?, ?, ?, ?, ?, ?, 'active', 1, ?, ?, ?)",
                (key, scope_digest, local_object, local_id, remote_object, normalized,
                 locator, now_us, locator, now_us))
        else:
            await _activate(tx, key, before.state.value, before.generation, remote_object,
                            normalized, locator, before.generation + 1, now_us)
    except DuplicateKey:
        # Taken between the read and the write (another bind, an adopt): the unique
        # active locator refused it.
        raise LinkRefused("remote_linked_elsewhere", "the remote record is already linked"
                          " to another local record; retire or rebind that link first"
                          ) from None
    except WorkConflict:
        raise LinkRefused("generation_moved", "the link changed while it was being bound:"
                          " look again") from None
    after = await read_link(tx, key)
    assert after is not None
    await _audit(tx, "link.bind", after, actor, role, reason, before, now_us)
    return LinkBound(after, decision, before)


async def retire_link(tx: SqlTx, link_key: str, *, expected_generation: int, actor: str,
                      role: str, reason: str, now_us: int) -> RemoteLink:
    """active/pending -> retired inside ``tx`` (compare-and-swap on the generation); audited."""
    before = await read_link(tx, link_key)
    if not await tx.execute(
        "UPDATE remote_links SET state = 'retired', active_locator = NULL,"
        " updated_at_us = ? WHERE link_key = ? AND generation = ?"
        " AND state IN ('active', 'pending_create')",
        (now_us, link_key, expected_generation),
    ):
        raise WorkConflict(f"link {link_key} changed or is not retirable")
    after = await read_link(tx, link_key)
    assert after is not None
    await _audit(tx, "link.retire", after, actor, role, reason, before, now_us)
    return after


async def _activate(tx: SqlTx, link_key: str, from_state: str, generation: int,
                    remote_object: str, remote_id: str, locator: str, new_generation: int,
                    now_us: int) -> None:
    if not await tx.execute(
        "UPDATE remote_links SET state = 'active', remote_object = ?, remote_id = ?,"
        " locator_hash = ?, active_locator = ?, generation = ?, updated_at_us = ?"
        " WHERE link_key = ? AND state = ? AND generation = ?",
        (remote_object, remote_id, locator, locator, new_generation, now_us, link_key,
         from_state, generation),
    ):
        raise WorkConflict(f"link {link_key} changed concurrently (expected generation"
                           f" {generation}, state {from_state})")


async def _audit(tx: SqlTx, action: str, link: RemoteLink, actor: str, role: str,
                 reason: str, before: RemoteLink | None, now_us: int) -> None:
    def view(lk: RemoteLink | None) -> str:
        if lk is None:
            return "{}"
        return json.dumps({"state": lk.state.value, "generation": lk.generation,
                           "remote_object": lk.remote_object, "remote_id": lk.remote_id})

    await append_audit(tx, AuditEntry(
        audit_id=new_ulid(now_us), at_us=now_us, actor=actor, role=role, action=action,
        target_kind="remote_link", target_id=link.link_key, reason=reason,
        before=view(before), after=view(link),
    ))
