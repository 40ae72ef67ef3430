"""Refresh ownership: single-winner token refresh per binding generation (seed 8.2).

A refresh is: a live WorkItem fence -> this lease's compare-and-swap -> the in-flight
record (the lease row itself: owner, token version refreshed from, start) -> one provider
call under a deadline shorter than the lease -> one transaction that installs the next
token version *and* clears the lease, only while the lease is still ours and unexpired.

* ``refresh_lease_acquire`` runs inside the caller's fenced transaction
  (``WorkStore.work_fenced``): a stale worker cannot even take the lease.
* A lease whose owner vanished (killed mid-refresh) is taken over once it expires; the new
  owner is told that the refresh token may already be spent (``possibly_spent``), because
  the old owner may have presented it.
* Nobody else calls the provider while a lease is live: they wait for the next version.
"""

from __future__ import annotations

import attrs

from daemon.core.grant_reasons import GrantReason
from daemon.core.token_bundle import SealedBundle
from storage.grants import GrantState, mark_grant_at, read_grant, replace_grant
from storage.port import Database, SqlTx


@attrs.frozen
class LeaseWon:
    lease_token: str
    from_version: int
    until_us: int
    # A previous owner's refresh from this same version never finished: its provider call
    # may have spent the refresh token.
    possibly_spent: bool


@attrs.frozen
class AlreadyRefreshed:
    """The grant moved past the version the caller saw: use the new one."""

    token_version: int


@attrs.frozen
class LeaseBusy:
    """Another owner is refreshing; its lease ends at ``until_us``."""

    until_us: int


@attrs.frozen
class GrantUnusable:
    reason: str  # "no_grant" | "needs_reauthorization" | "revoked"


async def refresh_lease_acquire(tx: SqlTx, *, binding_id: str, generation: int,
                                seen_version: int, lease_token: str, work_id: str,
                                epoch: int, ttl_us: int, now_us: int
                                ) -> LeaseWon | AlreadyRefreshed | LeaseBusy | GrantUnusable:
    grant = await read_grant(tx, binding_id, generation)
    if grant is None:
        return GrantUnusable("no_grant")
    if grant.state is not GrantState.VALID:
        return GrantUnusable(grant.state.value)
    if grant.token_version > seen_version:
        return AlreadyRefreshed(grant.token_version)
    rows = await tx.fetchall(
        "SELECT lease_token, until_us, from_version FROM refresh_leases"
        " WHERE binding_id = ? AND generation = ?", (binding_id, generation))
    if not rows:
        await tx.execute(
            "INSERT INTO refresh_leases (binding_id, generation, lease_token, owner_work_id,"
            " owner_epoch, until_us, from_version, started_at_us, refreshes_total)"
            " VALUES (?, ?, NULL, NULL, NULL, 0, 0, 0, 0)", (binding_id, generation))
        holder, until, from_version = None, 0, 0
    else:
        holder, until, from_version = rows[0][0], int(rows[0][1]), int(rows[0][2])
    if holder is not None and until >= now_us:
        return LeaseBusy(until)
    matched = await tx.execute(
        "UPDATE refresh_leases SET lease_token = ?, owner_work_id = ?, owner_epoch = ?,"
        " until_us = ?, from_version = ?, started_at_us = ?"
        " WHERE binding_id = ? AND generation = ? AND (lease_token IS NULL OR until_us < ?)",
        (lease_token, work_id, epoch, now_us + ttl_us, grant.token_version, now_us,
         binding_id, generation, now_us))
    if matched != 1:
        return LeaseBusy(now_us)
    # The grant was read before the lease row was ours: an owner that activated the next
    # version in between (and so freed the lease) would otherwise be followed by a second
    # refresh with the refresh token it already spent. Holding the lease row now, re-read
    # the grant with a statement that sees (and locks) its latest committed version.
    unchanged = await tx.execute(
        "UPDATE authorization_grants SET token_version = token_version"
        " WHERE binding_id = ? AND generation = ? AND token_version = ? AND state = ?",
        (binding_id, generation, grant.token_version, GrantState.VALID.value))
    if unchanged != 1:
        raise RefreshLeaseRaced(binding_id, generation, grant.token_version)
    return LeaseWon(lease_token, grant.token_version, now_us + ttl_us,
                    possibly_spent=holder is not None and from_version == grant.token_version)


class RefreshLeaseRaced(Exception):
    """The grant moved past the version the lease was taken for, within the acquiring
    transaction: that transaction must roll back (the lease is not taken) and the caller
    reads the grant again, as after :class:`AlreadyRefreshed`."""

    def __init__(self, binding_id: str, generation: int, seen_version: int) -> None:
        super().__init__(f"grant {binding_id}/{generation} moved past version {seen_version}"
                         " while its refresh lease was being taken")
        self.seen_version = seen_version


class RefreshLeases:
    db: Database

    async def refresh_activate(self, *, binding_id: str, generation: int, lease_token: str,
                               from_version: int, sealed: SealedBundle, expires_at_us: int,
                               now_us: int) -> bool:
        """Install ``from_version + 1`` and end the lease, atomically, only while the lease
        is ours and unexpired; False (nothing written) otherwise."""

        async def body(tx: SqlTx) -> bool:
            ended = await tx.execute(
                "UPDATE refresh_leases SET lease_token = NULL, owner_work_id = NULL,"
                " owner_epoch = NULL, refreshes_total = refreshes_total + 1"
                " WHERE binding_id = ? AND generation = ? AND lease_token = ? AND until_us >= ?",
                (binding_id, generation, lease_token, now_us))
            if ended != 1:
                return False
            if not await replace_grant(tx, binding_id=binding_id, generation=generation,
                                       expected_version=from_version, sealed=sealed,
                                       expires_at_us=expires_at_us, now_us=now_us,
                                       refreshed=True):
                raise _Rollback
            return True

        try:
            return await self.db.transact(body, name="refresh.activate")
        except _Rollback:
            return False

    async def refresh_fail(self, *, binding_id: str, generation: int, lease_token: str,
                           from_version: int, reauthorize: GrantReason | None,
                           now_us: int) -> None:
        """End our lease after a definitive failure, marking the grant (with why) when
        it needs re-authorization: the provider refused the refresh token
        (``invalid_grant``), or there is none to refresh with."""

        async def body(tx: SqlTx) -> None:
            ended = await tx.execute(
                "UPDATE refresh_leases SET lease_token = NULL, owner_work_id = NULL,"
                " owner_epoch = NULL WHERE binding_id = ? AND generation = ?"
                " AND lease_token = ?", (binding_id, generation, lease_token))
            if ended == 1 and reauthorize is not None:
                await mark_grant_at(tx, binding_id, generation, from_version,
                                    GrantState.NEEDS_REAUTHORIZATION, now_us, reauthorize)

        await self.db.transact(body, name="refresh.fail")

    async def refresh_in_flight(self, binding_id: str, generation: int, now_us: int) -> bool:
        """Whether a refresh (or mint) of this binding generation holds a live lease."""

        async def body(tx: SqlTx) -> bool:
            rows = await tx.fetchall(
                "SELECT lease_token, until_us FROM refresh_leases WHERE binding_id = ?"
                " AND generation = ?", (binding_id, generation))
            return bool(rows) and rows[0][0] is not None and int(rows[0][1]) > now_us

        return await self.db.transact(body, name="refresh.in_flight", write=False)

    async def refresh_count(self, binding_id: str, generation: int) -> int:
        async def body(tx: SqlTx) -> int:
            rows = await tx.fetchall(
                "SELECT refreshes_total FROM refresh_leases WHERE binding_id = ?"
                " AND generation = ?", (binding_id, generation))
            return int(rows[0][0]) if rows else 0

        return await self.db.transact(body, name="refresh.count", write=False)


class _Rollback(Exception):
    """The grant moved under a live lease (cannot happen through this module): undo."""
