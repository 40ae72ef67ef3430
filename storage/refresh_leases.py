"""Refresh ownership: single-winner token refresh per binding generation (seed 8.2).

A refresh is: a live WorkItem fence -> this lease's compare-and-swap -> the in-flight
record (the lease row itself: owner, token version refreshed from, start) -> the dispatch
marker (``call_sent_at_us``, committed right before the provider call by one transaction
that holds the live WorkItem fence *again* and compare-and-swaps the live lease token) ->
one provider call -> one transaction that installs the next token version *and* clears
the lease, while the lease is still ours.

* The claim is fenced twice, at the lease and at the marker, because the refresh lease
  may outlive the claim that took it: a claimant frozen (SIGSTOP, a stalled host) between
  the two, past its WorkItem lease, wakes to a live refresh lease on an item another
  replica reclaimed. Its marker is refused (:attr:`MarkerRefused.CLAIM_LOST`), so it never
  reaches the token endpoint. Only from the marker on does the call run on the refresh
  lease alone (its answer must be activated even if the claim ends meanwhile).

* ``refresh_lease_acquire`` runs inside the caller's fenced transaction
  (``WorkStore.work_fenced``): a stale worker cannot even take the lease. What it does
  with the row it finds is :func:`daemon.core.refresh_decision.decide_refresh`.
* A lease whose owner vanished before its call left (no marker) is taken over once it
  expires: the refresh token was never presented.
* A lease whose call left (marker) and was never activated is *never* taken over for the
  same version: a rotating refresh token may be spent, and presenting it again is a
  double refresh (``invalid_grant``; with reuse detection a provider may revoke the whole
  grant). The successor marks the grant in doubt (``refresh_in_doubt``) and leaves the
  lease pinned to the unfinished owner, whose late answer still activates by the lease
  token (:meth:`RefreshLeases.refresh_activate`) and heals the grant. An owner that
  knows its request never left after all (the marker refused, its COMMIT unconfirmed, no
  connection made) undoes the doubt instead, at the same version
  (:meth:`RefreshLeases.refresh_unsent`). A lease taken by a build that writes no marker
  (``call_token`` not its lease token) counts as dispatched.
* Nobody else calls the provider while a lease is live: they wait for the next version.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from daemon.core.grant_reasons import IN_DOUBT, GrantReason, grant_reason, unusable_code
from daemon.core.principals import BindingState
from daemon.core.refresh_decision import RefreshDecision, RefreshFacts, decide_refresh
from daemon.core.token_bundle import SealedBundle
from daemon.core.work import Fence
from storage.grants import (
    GrantState,
    heal_unsent_doubt,
    mark_grant_at,
    mark_in_doubt,
    read_grant,
    replace_grant,
)
from storage.port import Database, LostLease, SqlTx
from storage.work_claims import fence_lock


@attrs.frozen
class LeaseWon:
    lease_token: str
    from_version: int
    until_us: int


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
    reason: str  # "no_grant" | "needs_reauthorization" | "revoked" | "refresh_in_doubt"


async def refresh_lease_acquire(tx: SqlTx, *, binding_id: str, generation: int,
                                seen_version: int, lease_token: str, work_id: str,
                                epoch: int, ttl_us: int, now_us: int,
                                spends_credential: bool = True
                                ) -> LeaseWon | AlreadyRefreshed | LeaseBusy | GrantUnusable:
    """``spends_credential``: the call presents a rotating refresh token (False: an S2S
    mint, whose app JWT spends nothing, so an unfinished mint is simply done again)."""
    grant = await read_grant(tx, binding_id, generation)
    if grant is None:
        return GrantUnusable("no_grant")
    if grant.state is not GrantState.VALID:
        return GrantUnusable(unusable_code(grant.state.value,
                                           grant.reason.code if grant.reason else None))
    rows = await tx.fetchall(
        "SELECT lease_token, until_us, from_version, call_token, call_sent_at_us"
        " FROM refresh_leases WHERE binding_id = ? AND generation = ?",
        (binding_id, generation))
    if not rows:
        await tx.execute(
            "INSERT INTO refresh_leases (binding_id, generation, lease_token, owner_work_id,"
            " owner_epoch, until_us, from_version, started_at_us, refreshes_total)"
            " VALUES (?, ?, NULL, NULL, NULL, 0, 0, 0, 0)", (binding_id, generation))
        holder, until, from_version, call_token, sent_at = None, 0, 0, None, None
    else:
        holder, until, from_version = rows[0][0], int(rows[0][1]), int(rows[0][2])
        call_token, sent_at = rows[0][3], rows[0][4]
    decision = decide_refresh(RefreshFacts(
        grant_valid=True, grant_version=grant.token_version, seen_version=seen_version,
        held=holder is not None, until_us=until, from_version=from_version,
        marked=holder is not None and call_token == holder, call_sent=sent_at is not None,
        spends_credential=spends_credential, now_us=now_us))
    if decision is RefreshDecision.USE:
        return AlreadyRefreshed(grant.token_version)
    if decision is RefreshDecision.WAIT:
        return LeaseBusy(until)
    if decision is RefreshDecision.UNUSABLE:  # (the grant was read valid above)
        return GrantUnusable(grant.state.value)
    if decision is RefreshDecision.IN_DOUBT:
        # The lease stays pinned to its owner (its late answer may still heal the grant);
        # the grant says why nobody refreshes it. The doubt is judged from the lease row
        # as read above, so hold that row as read first: an owner that has since ended
        # its lease unspent (refresh_unsent: it never sent) is seen here, and we read
        # again instead of leaving a doubt nobody will undo. An UPDATE, so that the row
        # stays locked to COMMIT on MySQL-family servers (refresh_unsent locks it first
        # too), and a real change (the expired lease's end moved 1 µs earlier, still
        # expired), so that Galera certifies it against an owner on another node.
        held = await tx.execute(
            "UPDATE refresh_leases SET until_us = until_us - 1"
            " WHERE binding_id = ? AND generation = ? AND lease_token = ? AND until_us = ?"
            " AND ((call_token IS NULL AND ? IS NULL) OR call_token = ?)"
            " AND ((call_sent_at_us IS NULL AND ? IS NULL) OR call_sent_at_us = ?)",
            (binding_id, generation, holder, until, call_token, call_token,
             sent_at, sent_at))
        if held != 1:
            raise RefreshLeaseRaced(binding_id, generation, grant.token_version)
        # At a version that moved meanwhile (the owner activated it), nothing is marked:
        # read again.
        if not await mark_in_doubt(tx, binding_id, generation, grant.token_version,
                                   grant_reason(IN_DOUBT), now_us):
            raise RefreshLeaseRaced(binding_id, generation, grant.token_version)
        return GrantUnusable(IN_DOUBT)
    # Take it, only as we found it (an owner's marker committed since our read is seen
    # here: the compare-and-swap names the holder and its marker as read).
    matched = await tx.execute(
        "UPDATE refresh_leases SET lease_token = ?, owner_work_id = ?, owner_epoch = ?,"
        " until_us = ?, from_version = ?, started_at_us = ?, call_token = ?,"
        " call_sent_at_us = NULL"
        " WHERE binding_id = ? AND generation = ? AND (lease_token IS NULL OR until_us < ?)"
        " AND ((lease_token IS NULL AND ? IS NULL) OR lease_token = ?)"
        " AND ((call_sent_at_us IS NULL AND ? IS NULL) OR call_sent_at_us = ?)",
        (lease_token, work_id, epoch, now_us + ttl_us, grant.token_version, now_us,
         lease_token, binding_id, generation, now_us, holder, holder, sent_at, sent_at))
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
    return LeaseWon(lease_token, grant.token_version, now_us + ttl_us)


class RefreshLeaseRaced(Exception):
    """The grant moved past the version the lease was taken for, or the lease row moved
    from what the acquiring transaction read (its owner ended it), within that
    transaction: it must roll back (nothing taken or marked) and the caller reads the
    grant again, as after :class:`AlreadyRefreshed`."""

    def __init__(self, binding_id: str, generation: int, seen_version: int) -> None:
        super().__init__(f"grant {binding_id}/{generation} or its refresh lease moved"
                         f" (version {seen_version} was read) while the lease was being"
                         " taken")
        self.seen_version = seen_version


class MarkerRefused(enum.StrEnum):
    """Why the dispatch marker was not written (stable reason codes): the call must not
    leave."""

    CLAIM_LOST = "claim_lost_before_call"  # the WorkItem fence is gone (seed 5.1)
    LEASE_LOST = "lease_ended_before_call"  # the refresh lease ended or was taken over
    # The binding moved after the lease was taken (seed 8.1, 13): the superseded
    # generation's refresh token is never presented again.
    BINDING_MOVED = "binding_moved_before_call"  # reconnected or reinstalled
    BINDING_DISCONNECTED = "binding_disconnected_before_call"
    GRANT_REVOKED = "grant_revoked_before_call"


async def _why_unmarked(tx: SqlTx, binding_id: str, generation: int) -> MarkerRefused:
    """Why the marker's statement matched nothing (read only when it did not)."""
    rows = await tx.fetchall(
        "SELECT generation, state FROM principal_bindings WHERE binding_id = ?",
        (binding_id,))
    if rows and int(rows[0][0]) != generation:
        return MarkerRefused.BINDING_MOVED
    if rows and str(rows[0][1]) != BindingState.CONNECTED.value:
        return MarkerRefused.BINDING_DISCONNECTED
    grant = await read_grant(tx, binding_id, generation)
    if grant is not None and grant.state is GrantState.REVOKED:
        return MarkerRefused.GRANT_REVOKED
    return MarkerRefused.LEASE_LOST


class RefreshLeases:
    db: Database

    async def refresh_dispatch(self, *, fence: Fence, binding_id: str, generation: int,
                               lease_token: str, now: Callable[[], int]) -> MarkerRefused | None:
        """Record, durably, that our call is about to leave: in one transaction, the live
        WorkItem fence of the claim that took the lease (seed 5.1: a stale claimant never
        reaches the token endpoint), then a compare-and-swap on our live, marked lease.
        None: written, the call may leave. Otherwise nothing is written and the caller
        must not call: :attr:`MarkerRefused.CLAIM_LOST` (the claim's lease ended or the
        item was reclaimed while the refresh lease was still ours) or
        :attr:`MarkerRefused.LEASE_LOST` (the refresh lease ended or was taken over).
        From the marker on, the call runs on the refresh lease alone, and nobody presents
        this version's refresh token again unless this owner ends its lease.

        ``now`` is read inside the transaction, when its statements run: a time read
        before it (before waiting for a connection, or before a freeze) would judge both
        leases at a moment already past, and a claimant frozen past its WorkItem lease
        would still pass the fence (simulation seeds 28, 58 and 104).

        The same statement judges the binding as it is then: the lease was taken on a
        valid grant of this generation, but a reconnect, a reinstall, a disconnect or the
        grant's revocation may have committed since (the window the simulation's reconnect
        operator places its moves in). Then nothing is written and the superseded
        generation's refresh token never leaves: :attr:`MarkerRefused.BINDING_MOVED`,
        ``BINDING_DISCONNECTED`` or ``GRANT_REVOKED`` (a binding with no durable row, a
        configuration-only one, is judged by its grant alone)."""

        async def body(tx: SqlTx) -> MarkerRefused | None:
            now_us = now()
            await fence_lock(tx, fence, now_us)  # first: it locks the item, as acquire does
            marked = await tx.execute(
                "UPDATE refresh_leases SET call_sent_at_us = ? WHERE binding_id = ?"
                " AND generation = ? AND lease_token = ? AND call_token = ?"
                " AND until_us >= ? AND call_sent_at_us IS NULL"
                " AND NOT EXISTS (SELECT 1 FROM principal_bindings b"
                "   WHERE b.binding_id = ? AND (b.generation <> ? OR b.state <> ?))"
                " AND NOT EXISTS (SELECT 1 FROM authorization_grants g"
                "   WHERE g.binding_id = ? AND g.generation = ? AND g.state = ?)",
                (now_us, binding_id, generation, lease_token, lease_token, now_us,
                 binding_id, generation, BindingState.CONNECTED.value,
                 binding_id, generation, GrantState.REVOKED.value))
            if marked == 1:
                return None
            return await _why_unmarked(tx, binding_id, generation)

        try:
            return await self.db.transact(body, name="refresh.dispatch")
        except LostLease:
            return MarkerRefused.CLAIM_LOST  # rolled back: nothing was written

    async def refresh_activate(self, *, binding_id: str, generation: int, lease_token: str,
                               from_version: int, sealed: SealedBundle, expires_at_us: int,
                               now_us: int) -> bool:
        """Install ``from_version + 1`` and end the lease, atomically; False (nothing
        written) otherwise. The lease must be ours, and unexpired *or* dispatched: a
        dispatched lease is never taken over for its version, so a late answer still
        activates by it, healing a grant marked in doubt meanwhile (as long as nobody
        installed a newer version: re-authorization, a rewrap). A grant needing
        re-authorization for another reason, or revoked, is never made valid here."""

        async def body(tx: SqlTx) -> bool:
            ended = await tx.execute(
                "UPDATE refresh_leases SET lease_token = NULL, owner_work_id = NULL,"
                " owner_epoch = NULL, call_token = NULL, call_sent_at_us = NULL,"
                " refreshes_total = refreshes_total + 1"
                " WHERE binding_id = ? AND generation = ? AND lease_token = ?"
                " AND (until_us >= ? OR (call_token = lease_token"
                " AND call_sent_at_us IS NOT NULL))",
                (binding_id, generation, lease_token, now_us))
            if ended != 1:
                return False
            grant = await read_grant(tx, binding_id, generation)
            healable = grant is not None and (
                grant.state is GrantState.VALID
                or (grant.state is GrantState.NEEDS_REAUTHORIZATION
                    and grant.reason is not None and grant.reason.code == IN_DOUBT))
            if not healable or not await replace_grant(
                    tx, binding_id=binding_id, generation=generation,
                    expected_version=from_version, sealed=sealed,
                    expires_at_us=expires_at_us, now_us=now_us, refreshed=True):
                raise _Rollback
            return True

        try:
            return await self.db.transact(body, name="refresh.activate")
        except _Rollback:
            return False

    async def refresh_in_doubt(self, *, binding_id: str, generation: int, lease_token: str,
                               from_version: int, now_us: int) -> bool:
        """Our dispatched call got no usable answer (no answer in time, a broken
        connection, a malformed one): the refresh token may be spent. Mark the grant in
        doubt now (a successor would at our lease's end) and keep the lease pinned; False
        when the lease is not ours and dispatched, or the grant moved."""

        async def body(tx: SqlTx) -> bool:
            # An UPDATE that changes nothing, not a SELECT: it locks the lease row until
            # the grant is marked, and counts it (the adapters count matched rows).
            ours = await tx.execute(
                "UPDATE refresh_leases SET call_sent_at_us = call_sent_at_us"
                " WHERE binding_id = ? AND generation = ? AND lease_token = ?"
                " AND call_token = ? AND call_sent_at_us IS NOT NULL",
                (binding_id, generation, lease_token, lease_token))
            return ours == 1 and await mark_in_doubt(
                tx, binding_id, generation, from_version, grant_reason(IN_DOUBT), now_us)

        return await self.db.transact(body, name="refresh.in_doubt")

    async def refresh_fail(self, *, binding_id: str, generation: int, lease_token: str,
                           from_version: int, reauthorize: GrantReason | None,
                           now_us: int) -> None:
        """End our lease after a definitive answer or before anything left, marking the
        grant (with why) when it needs re-authorization: the provider refused the refresh
        token (``invalid_grant``), or there is none to refresh with. With
        ``reauthorize`` None the refresh token is unspent (the call never left, or the
        endpoint refused the request before using it) and the next owner may refresh."""

        async def body(tx: SqlTx) -> None:
            ended = await tx.execute(
                "UPDATE refresh_leases SET lease_token = NULL, owner_work_id = NULL,"
                " owner_epoch = NULL, call_token = NULL, call_sent_at_us = NULL"
                " WHERE binding_id = ? AND generation = ? AND lease_token = ?",
                (binding_id, generation, lease_token))
            if ended == 1 and reauthorize is not None:
                await mark_grant_at(tx, binding_id, generation, from_version,
                                    GrantState.NEEDS_REAUTHORIZATION, now_us, reauthorize)

        await self.db.transact(body, name="refresh.fail")

    async def refresh_unsent(self, *, binding_id: str, generation: int, lease_token: str,
                             from_version: int, now_us: int) -> bool:
        """Our call never left and never will (the marker was refused, its COMMIT went
        unconfirmed, or no connection to the token endpoint was made): end our lease
        unspent, as :meth:`refresh_fail` does, and, if a successor meanwhile found it
        expired with our marker and put the grant in doubt, make the grant valid again at
        ``from_version`` (the refresh token is unspent), in the same transaction and only
        while the lease is still ours: the next owner refreshes normally. True: a doubt
        was undone. Only for an owner certain that no byte of its request left; a call
        that may have left stays in doubt (its answer heals it, or re-authorization)."""

        async def body(tx: SqlTx) -> bool:
            # The lease row first, as activation and refresh_in_doubt lock it (an UPDATE
            # that changes nothing: it locks the row and counts it); not ours: nothing.
            ours = await tx.execute(
                "UPDATE refresh_leases SET call_sent_at_us = call_sent_at_us"
                " WHERE binding_id = ? AND generation = ? AND lease_token = ?",
                (binding_id, generation, lease_token))
            if ours != 1:
                return False
            healed = await heal_unsent_doubt(tx, binding_id=binding_id,
                                             generation=generation, version=from_version,
                                             lease_token=lease_token, now_us=now_us)
            await tx.execute(
                "UPDATE refresh_leases SET lease_token = NULL, owner_work_id = NULL,"
                " owner_epoch = NULL, call_token = NULL, call_sent_at_us = NULL"
                " WHERE binding_id = ? AND generation = ? AND lease_token = ?",
                (binding_id, generation, lease_token))
            return healed

        return await self.db.transact(body, name="refresh.unsent")

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
    """The grant moved under our lease (re-authorization or a rewrap installed another
    version while our call was out), or it is not one an activation may make valid: undo."""
