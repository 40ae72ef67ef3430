"""AuthorizationGrant: sealed token bundles per binding generation (seed 8.2).

Every write is a compare-and-swap on ``token_version`` (judged by matched rows), so two
writers can never both install "the next version": a refresh, a rotation and a key
rewrap that race have one winner, and a stale writer can never overwrite a newer version.
The bundle is stored sealed (:mod:`daemon.core.token_bundle`); this module never sees a
token in the clear.
"""

from __future__ import annotations

import base64
import enum

import attrs

from daemon.core.grant_reasons import IN_DOUBT, GrantReason
from daemon.core.token_bundle import SealedBundle
from storage.port import AuditEntry, Database, DuplicateKey, Row, SqlTx, WorkConflict
from storage.work_admin import append_audit


class RewrapOutcome(enum.StrEnum):
    REWRAPPED = "rewrapped"
    MOVED = "moved"            # another writer installed a newer version first
    REFRESHING = "refreshing"  # a refresh of it is in flight: left to the refresh


class GrantState(enum.StrEnum):
    VALID = "valid"
    NEEDS_REAUTHORIZATION = "needs_reauthorization"
    REVOKED = "revoked"


@attrs.frozen
class StoredGrant:
    binding_id: str
    generation: int
    token_version: int
    sealed: SealedBundle
    state: GrantState
    expires_at_us: int
    last_refresh_at_us: int
    updated_at_us: int
    # Why it needs re-authorization (daemon/core/grant_reasons.py); None when valid.
    reason: GrantReason | None = None


_COLUMNS = (
    "binding_id, generation, token_version, key_id, nonce_hex, ciphertext_b64, state,"
    " expires_at_us, last_refresh_at_us, updated_at_us, reason_code, reason_text"
)


def _from_row(row: Row) -> StoredGrant:
    return StoredGrant(
        binding_id=str(row[0]), generation=int(row[1]), token_version=int(row[2]),
        sealed=SealedBundle(str(row[3]), bytes.fromhex(str(row[4])),
                            base64.b64decode(str(row[5]))),
        state=GrantState(row[6]), expires_at_us=int(row[7]), last_refresh_at_us=int(row[8]),
        updated_at_us=int(row[9]),
        reason=None if row[10] is None else GrantReason(str(row[10]), str(row[11] or "")),
    )


async def read_grant(tx: SqlTx, binding_id: str, generation: int) -> StoredGrant | None:
    rows = await tx.fetchall(
        f"SELECT {_COLUMNS} FROM authorization_grants WHERE binding_id = ? AND generation = ?",
        (binding_id, generation))
    return _from_row(rows[0]) if rows else None


async def replace_grant(tx: SqlTx, *, binding_id: str, generation: int, expected_version: int,
                        sealed: SealedBundle, expires_at_us: int, now_us: int,
                        refreshed: bool, keep_state: bool = False) -> bool:
    """Install ``expected_version + 1`` if the row is still at ``expected_version``.

    A revoked grant stays revoked (a refresh or rewrap that raced a disconnect must not
    make it valid again); any other state becomes valid with the new bundle, and its
    re-authorization reason is cleared. (The reason columns are assigned before
    ``state``: MySQL evaluates SET left to right, later assignments seeing new values.)
    ``keep_state``: the same credential under another key (a rewrap), which cures
    nothing: state and reason stay (a grant in doubt, whose refresh token may be spent,
    must not become valid by being re-encrypted)."""
    revoked, valid = GrantState.REVOKED.value, GrantState.VALID.value
    # A rewrap leaves state and reason as they are; anything else cures all but revoked.
    cure, cure_params = ("", ()) if keep_state else (
        " reason_code = CASE WHEN state = ? THEN reason_code ELSE NULL END,"
        " reason_text = CASE WHEN state = ? THEN reason_text ELSE NULL END,"
        " state = CASE WHEN state = ? THEN state ELSE ? END,",
        (revoked, revoked, revoked, valid))
    matched = await tx.execute(
        "UPDATE authorization_grants SET token_version = token_version + 1, key_id = ?,"
        " nonce_hex = ?, ciphertext_b64 = ?," + cure + " expires_at_us = ?,"
        " last_refresh_at_us = CASE WHEN ? = 1 THEN ? ELSE last_refresh_at_us END,"
        " updated_at_us = ?"
        " WHERE binding_id = ? AND generation = ? AND token_version = ?",
        (sealed.key_id, sealed.nonce.hex(), base64.b64encode(sealed.ciphertext).decode(),
         *cure_params, expires_at_us, 1 if refreshed else 0, now_us, now_us,
         binding_id, generation, expected_version))
    return matched == 1


async def insert_grant(tx: SqlTx, *, binding_id: str, generation: int, sealed: SealedBundle,
                       expires_at_us: int, now_us: int) -> StoredGrant:
    """The first grant of a binding generation (token version 1) and its idle
    refresh-ownership row (so that racing first refreshes only CAS)."""
    await tx.execute(
        f"INSERT INTO authorization_grants ({_COLUMNS})"
        " VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
        (binding_id, generation, sealed.key_id, sealed.nonce.hex(),
         base64.b64encode(sealed.ciphertext).decode(), GrantState.VALID.value,
         expires_at_us, now_us, now_us))
    await tx.execute(
        "INSERT INTO refresh_leases (binding_id, generation, lease_token, owner_work_id,"
        " owner_epoch, until_us, from_version, started_at_us, refreshes_total)"
        " VALUES (?, ?, NULL, NULL, NULL, 0, 0, 0, 0)", (binding_id, generation))
    found = await read_grant(tx, binding_id, generation)
    assert found is not None
    return found


def _reason_params(reason: GrantReason | None) -> tuple[str | None, str | None]:
    return (None, None) if reason is None else (reason.code, reason.text)


async def mark_grant(tx: SqlTx, binding_id: str, generation: int, state: GrantState,
                     now_us: int, reason: GrantReason | None = None) -> bool:
    """Set the grant's state (and its reason: None clears it) whatever its version (a
    disconnect revokes it)."""
    return await tx.execute(
        "UPDATE authorization_grants SET state = ?, reason_code = ?, reason_text = ?,"
        " updated_at_us = ? WHERE binding_id = ? AND generation = ?",
        (state.value, *_reason_params(reason), now_us, binding_id, generation)) == 1


async def mark_grant_at(tx: SqlTx, binding_id: str, generation: int, expected_version: int,
                        state: GrantState, now_us: int, reason: GrantReason | None) -> bool:
    """Set the grant's state and reason at the token version the caller saw; False when
    a newer version arrived meanwhile."""
    return await tx.execute(
        "UPDATE authorization_grants SET state = ?, reason_code = ?, reason_text = ?,"
        " updated_at_us = ? WHERE binding_id = ? AND generation = ? AND token_version = ?",
        (state.value, *_reason_params(reason), now_us, binding_id, generation,
         expected_version)) == 1


async def mark_in_doubt(tx: SqlTx, binding_id: str, generation: int, version: int,
                        reason: GrantReason, now_us: int) -> bool:
    """A valid grant at ``version`` needs re-authorization with an in-doubt refresh's
    reason; False (nothing written) when it moved to another version or is not valid
    (a revoked grant stays revoked)."""
    return await tx.execute(
        "UPDATE authorization_grants SET reason_code = ?, reason_text = ?, state = ?,"
        " updated_at_us = ? WHERE binding_id = ? AND generation = ? AND token_version = ?"
        " AND state = ?",
        (reason.code, reason.text, GrantState.NEEDS_REAUTHORIZATION.value, now_us,
         binding_id, generation, version, GrantState.VALID.value)) == 1


async def heal_unsent_doubt(tx: SqlTx, *, binding_id: str, generation: int, version: int,
                            lease_token: str, now_us: int) -> bool:
    """Undo a doubt the refresh lease ``lease_token`` caused though its call never left:
    the grant, in doubt (``refresh_in_doubt``) at ``version``, is valid again at that same
    version (its refresh token was never presented, so it is unspent); False (nothing
    written) otherwise. One statement carries both guards: the grant as the doubt left it,
    and the lease row still this owner's, taken by it (``call_token``) and marked
    (``call_sent_at_us``): the only lease whose marker a successor can have judged."""
    return await tx.execute(
        "UPDATE authorization_grants SET reason_code = NULL, reason_text = NULL, state = ?,"
        " updated_at_us = ? WHERE binding_id = ? AND generation = ? AND token_version = ?"
        " AND state = ? AND reason_code = ?"
        " AND EXISTS (SELECT 1 FROM refresh_leases l WHERE l.binding_id = ?"
        "   AND l.generation = ? AND l.lease_token = ? AND l.call_token = ?"
        "   AND l.from_version = ? AND l.call_sent_at_us IS NOT NULL)",
        (GrantState.VALID.value, now_us, binding_id, generation, version,
         GrantState.NEEDS_REAUTHORIZATION.value, IN_DOUBT,
         binding_id, generation, lease_token, lease_token, version)) == 1


class AuthorizationGrants:
    db: Database

    async def grant_install(self, *, binding_id: str, generation: int, sealed: SealedBundle,
                            expires_at_us: int, now_us: int) -> StoredGrant:
        """The first grant of a binding generation (token version 1)."""

        async def body(tx: SqlTx) -> StoredGrant:
            return await insert_grant(tx, binding_id=binding_id, generation=generation,
                                      sealed=sealed, expires_at_us=expires_at_us,
                                      now_us=now_us)

        try:
            return await self.db.transact(body, name="grant.install")
        except DuplicateKey:
            raise WorkConflict(f"binding {binding_id} generation {generation} already has a"
                               " grant") from None

    async def grant_get(self, binding_id: str, generation: int) -> StoredGrant | None:
        async def body(tx: SqlTx) -> StoredGrant | None:
            return await read_grant(tx, binding_id, generation)

        return await self.db.transact(body, name="grant.get", write=False)

    async def grant_reauthorization_counts(self) -> dict[str, int]:
        """How many bindings' *current* grants need re-authorization, by reason code
        (``unrecorded``: marked before the reason was kept). One read, no bundle."""

        async def body(tx: SqlTx) -> dict[str, int]:
            rows = await tx.fetchall(
                "SELECT g.reason_code, COUNT(*) FROM authorization_grants g"
                " JOIN principal_bindings b ON b.binding_id = g.binding_id"
                " AND b.generation = g.generation WHERE g.state = ?"
                " GROUP BY g.reason_code", (GrantState.NEEDS_REAUTHORIZATION.value,))
            out: dict[str, int] = {}
            for code, n in rows:
                name = "unrecorded" if code is None else str(code)
                out[name] = out.get(name, 0) + int(n)
            return out

        return await self.db.transact(body, name="grant.reauthorization_counts", write=False)

    async def grant_list(self) -> list[StoredGrant]:
        async def body(tx: SqlTx) -> list[StoredGrant]:
            rows = await tx.fetchall(
                f"SELECT {_COLUMNS} FROM authorization_grants ORDER BY binding_id, generation")
            return [_from_row(r) for r in rows]

        return await self.db.transact(body, name="grant.list", write=False)

    async def grant_rewrap(self, *, binding_id: str, generation: int, expected_version: int,
                           sealed: SealedBundle, expires_at_us: int, now_us: int,
                           audit: AuditEntry) -> RewrapOutcome:
        """A key rotation's rewrap of one grant (the same credential under another key: the
        next token version, state and reason kept), unless a refresh of it is in flight.

        A refresh took its lease from the version it read and activates its answer by a
        compare-and-swap on that version: a rewrap installed meanwhile would make the
        activation fail and drop the answer, leaving the grant with the refresh token the
        provider has just rotated away (simulation seed 7: the next refresh presented it
        again, ``invalid_grant``). So the rewrap first locks the refresh lease row (the
        row the lease's own compare-and-swap locks first, so the two serialize) and leaves
        the grant alone while that lease is live, or its call left and was never
        activated (a lease of a build without the marker counts as left): ``REFRESHING``;
        a later rotation rewraps what the refresh sealed. ``MOVED``: the grant is no
        longer at ``expected_version``."""

        async def body(tx: SqlTx) -> RewrapOutcome:
            await tx.execute(
                "UPDATE refresh_leases SET refreshes_total = refreshes_total"
                " WHERE binding_id = ? AND generation = ?", (binding_id, generation))
            busy = await tx.fetchall(
                "SELECT 1 FROM refresh_leases WHERE binding_id = ? AND generation = ?"
                " AND lease_token IS NOT NULL AND (until_us >= ? OR call_token IS NULL"
                " OR call_token <> lease_token OR call_sent_at_us IS NOT NULL)",
                (binding_id, generation, now_us))
            if busy:
                return RewrapOutcome.REFRESHING
            if not await replace_grant(tx, binding_id=binding_id, generation=generation,
                                       expected_version=expected_version, sealed=sealed,
                                       expires_at_us=expires_at_us, now_us=now_us,
                                       refreshed=False,
                                       keep_state=True):
                return RewrapOutcome.MOVED
            await append_audit(tx, audit)
            return RewrapOutcome.REWRAPPED

        return await self.db.transact(body, name="grant.rewrap")

    async def grant_replace(self, *, binding_id: str, generation: int, expected_version: int,
                            sealed: SealedBundle, expires_at_us: int, now_us: int,
                            refreshed: bool, audit: AuditEntry | None = None,
                            keep_state: bool = False) -> bool:
        """CAS to the next token version; False when another writer got there first."""

        async def body(tx: SqlTx) -> bool:
            ok = await replace_grant(tx, binding_id=binding_id, generation=generation,
                                     expected_version=expected_version, sealed=sealed,
                                     expires_at_us=expires_at_us, now_us=now_us,
                                     refreshed=refreshed, keep_state=keep_state)
            if ok and audit is not None:
                await append_audit(tx, audit)
            return ok

        return await self.db.transact(body, name="grant.replace")

    async def grant_mark(self, binding_id: str, generation: int, expected_version: int,
                         state: GrantState, now_us: int,
                         reason: GrantReason | None = None) -> bool:
        """Set the grant's state and reason at the version the caller saw (e.g. needs
        re-authorization after a bundle failed authentication); False when a newer
        version arrived meanwhile."""

        async def body(tx: SqlTx) -> bool:
            return await mark_grant_at(tx, binding_id, generation, expected_version, state,
                                       now_us, reason)

        return await self.db.transact(body, name="grant.mark")
