"""The token owner: a usable access token for a live claim, refreshed by one winner (seed 8.2).

Theory of operation
-------------------
:meth:`TokenOwner.access_token` is called by a handler that holds a live WorkItem fence and
needs the binding generation's access token:

1. Read the grant. Unusable (none, needs re-authorization, revoked, a refresh in doubt):
   fail closed with that reason. Not expiring within ``margin``, and not the version a
   provider 401 rejected: open the bundle and return it.
2. Otherwise take the refresh lease *inside the fenced transaction* (a stale claimant can
   change nothing, so it never reaches the provider). Losers wait, bounded, for the next
   token version and use it; nobody else calls the provider while a lease is live.
   Who may do what with the lease row found is :mod:`daemon.core.refresh_decision`.
3. The winner commits the **dispatch marker**, in one transaction that holds the live
   WorkItem fence again and compare-and-swaps its live lease token, then calls the token
   endpoint once. An owner whose lease ended or was taken over cannot write it and does
   not call (``lease_ended_before_call``: ``refresh_lease_lost``); nor does a claimant
   frozen past its WorkItem lease whose item another replica reclaimed meanwhile, though
   its refresh lease still lives (``claim_lost_before_call``: it stops with
   ``LostLease``, its lease ended unspent for the item's new owner). From the marker on,
   and only from there, the exchange runs on the refresh lease alone; a rotating
   refresh token may be spent, so:

   * the owner keeps reading the answer past its lease, up to its own ``answer_wait``
     (``replica.refresh_answer_wait``; a drain's or forced stop's hard deadline cuts it,
     :meth:`TokenOwner.abandon_at`), fenced by the lease
     alone (not by the claim that started it), and activates the next bundle and version
     by a compare-and-swap on (binding, generation, from version, its lease token);
   * a successor that finds the lease expired *with* the marker never presents the old
     refresh token: it marks the grant ``needs_reauthorization`` with the reason
     ``refresh_in_doubt`` (visible on the console, ``binding show`` and the
     ``integrationd_grants_needing_reauthorization{reason}`` gauge) and fails closed with
     ``refresh_in_doubt``, which effects treat as "retry later", never as a failure;
   * the owner's late answer heals the grant (valid at the new version, reason cleared),
     no operator needed, unless a newer version was installed meanwhile;
   * an owner that knows for certain its request never left (its marker refused, the
     marker's COMMIT unconfirmed, no connection made) ends its lease unspent and undoes
     such a doubt: valid again at the *same* version (``refresh_unsent``), so the next
     owner refreshes normally;
   * an expired lease *without* the marker means the token never left: the successor
     refreshes normally.

4. ``invalid_grant``: the grant needs re-authorization (one attempt, never a loop). An
   answer that does not say what happened to the refresh token (none in time, a broken
   connection after it was sent, a malformed or 5xx answer) marks the grant in doubt at
   once. A connection never made, or a request the endpoint refused before using the
   token (an OAuth error other than ``invalid_grant``), ends the lease unspent. A
   response without a new refresh token keeps the old one. A mint (S2S) spends nothing:
   an unfinished mint just ends, and the next owner mints again.

The trade, stated: with strict refresh-token rotation, a process that dies (SIGKILL, OOM,
power) after its call left and before it activated the answer takes the only copy of the
rotated refresh token with it; no design can recover a token only the dead process saw.
The grant then stays in doubt until the binding is re-authorized. The alternative,
presenting the old token again, is a double refresh: ``invalid_grant`` at best, and under
refresh-token reuse detection (OAuth 2.1, RFC 9700) the provider revokes the whole grant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn

import attrs
import httpx
import jwt
import trio

from config.settings import Secret
from daemon.core.grant_reasons import (
    IN_DOUBT,
    GrantReason,
    grant_reason,
    refused_refresh,
    unusable_code,
)
from daemon.core.token_bundle import (
    BundleContext,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    seal,
)
from daemon.core.work import Fence
from daemon.services import logs
from daemon.services.clock import Clock
from storage.idgen import new_lease_token
from storage.port import DuplicateKey, LostLease, SqlTx, StorageError
from storage.refresh_leases import (
    AlreadyRefreshed,
    GrantUnusable,
    LeaseBusy,
    LeaseWon,
    MarkerRefused,
    RefreshLeaseRaced,
    refresh_lease_acquire,
)
from storage.work_store import WorkStore


class TokenUnavailable(Exception):
    """No usable token; ``reason`` is a stable code the effect records (never a secret)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@attrs.frozen
class RefreshEndpoint:
    """Where and as whom a binding's refresh token is exchanged (L1 path, L2 client)."""

    url: str
    client_id: str
    client_secret: Secret


@attrs.frozen
class MintEndpoint:
    """Where and as which app a server-to-server token is minted (seed 8.2: "S2S mint"):
    an RS256 app JWT (``iss`` = the app's S2S id) exchanged for a new access token. There
    is no refresh token: every expiry (or 401) mints again, through the same lease."""

    url: str
    app_id: str
    private_key_pem: Secret
    jwt_lifetime_s: int = 60


@attrs.frozen
class AccessToken:
    token: SecretText
    token_version: int


@attrs.define(eq=False)
class TokenOwner:
    store: WorkStore
    keys: Mapping[str, TokenKey]
    active_key: str
    http: httpx.AsyncClient
    clock: Clock
    # Refresh when the token expires within this margin.
    margin_us: int = 60_000_000
    # The refresh lease: until its end nobody else refreshes, and the owner must have
    # written its dispatch marker by then, or not call at all.
    lease_us: int = 30_000_000
    # Time allowed for each write around the call (the marker, then the outcome).
    call_margin_us: int = 5_000_000
    # How long the owner reads the answer of a call that left, past its lease if need
    # be (the refresh token may be spent: only this answer can heal the grant;
    # ``replica.refresh_answer_wait``). A drain's or forced stop's hard deadline cuts it.
    answer_wait_us: int = 90_000_000
    # How long a loser waits for the winner's new version before giving up (closed).
    wait_us: int = 35_000_000
    poll_s: float = 0.05
    # A forced stop's deadline (trio time) and the shielded exchanges it bounds.
    _abandon_at: float = attrs.field(default=math.inf, init=False)
    _exchanges: set[trio.CancelScope] = attrs.field(factory=set, init=False)

    def abandon_at(self, deadline: float) -> None:
        """A shutting-down process's hard deadline: no refresh exchange outlives it (an
        abandoned exchange leaves its dispatch marker, so its grant ends in doubt)."""
        self._abandon_at = min(self._abandon_at, deadline)
        for scope in self._exchanges:
            scope.deadline = min(scope.deadline, deadline)

    async def access_token(self, fence: Fence, binding_id: str, generation: int,
                           endpoint: RefreshEndpoint | MintEndpoint, *,
                           rejected_version: int | None = None) -> AccessToken:
        """The current access token; with ``rejected_version`` (the provider answered 401
        to that version), one that is newer, refreshing if nobody has yet."""
        waited_from = self.clock.now_us()
        while True:
            grant = await self.store.grant_get(binding_id, generation)
            if grant is None:
                raise TokenUnavailable("no_grant", f"binding {binding_id} generation"
                                       f" {generation} has no grant")
            if grant.state.value != "valid":
                code = unusable_code(grant.state.value,
                                     grant.reason.code if grant.reason else None)
                raise TokenUnavailable(code, _unusable_text(binding_id, generation, code))
            context = BundleContext(binding_id, generation, grant.token_version)
            # A bundle that fails authentication (or whose key this replica lacks) is
            # refused here and never used (BundleRefused: counted and alerted). It marks
            # nothing on the shared grant: AES-GCM cannot tell a tampered bundle from this
            # replica's wrong key under the right id (a swapped key file, a restored
            # backup), and a tampered bundle fails on every replica by itself, while
            # marking it would stop every replica's work and ask every user to
            # re-authorize for one host's configuration error.
            bundle = open_bundle(grant.sealed, self.keys, context)
            now = self.clock.now_us()
            rejected = rejected_version is not None and grant.token_version <= rejected_version
            if not rejected and bundle.expires_at_us - self.margin_us > now:
                return AccessToken(bundle.access_token, grant.token_version)
            outcome = await self._take_lease(fence, binding_id, generation, grant.token_version,
                                             spends_credential=isinstance(endpoint,
                                                                          RefreshEndpoint))
            if isinstance(outcome, GrantUnusable):
                if outcome.reason == IN_DOUBT:
                    logs.warn("token_refresh_in_doubt", binding_id=binding_id,
                              generation=generation, from_version=grant.token_version,
                              found="an expired lease whose call left")
                raise TokenUnavailable(outcome.reason,
                                       _unusable_text(binding_id, generation, outcome.reason))
            if isinstance(outcome, AlreadyRefreshed):
                continue
            if isinstance(outcome, LeaseBusy):
                if self.clock.now_us() - waited_from > self.wait_us:
                    raise TokenUnavailable("refresh_wait_timeout",
                                           "another replica's refresh did not finish in time")
                await trio.sleep(self.poll_s)
                continue
            return await self._refresh(fence, binding_id, generation, endpoint, bundle,
                                       outcome)

    async def _take_lease(self, fence: Fence, binding_id: str, generation: int,
                          seen_version: int, *, spends_credential: bool = True
                          ) -> LeaseWon | AlreadyRefreshed | LeaseBusy | GrantUnusable:
        token = new_lease_token()
        now = self.clock.now_us()

        async def body(tx: SqlTx) -> LeaseWon | AlreadyRefreshed | LeaseBusy | GrantUnusable:
            return await refresh_lease_acquire(
                tx, binding_id=binding_id, generation=generation, seen_version=seen_version,
                lease_token=token, work_id=fence.work_id, epoch=fence.ownership_epoch,
                ttl_us=self.lease_us, now_us=now, spends_credential=spends_credential)

        try:
            return await self.store.work_fenced(fence, self.clock.now_us, body,
                                                name="refresh.lease")
        except DuplicateKey:
            return LeaseBusy(now)  # two first owners created the lease row at once
        except RefreshLeaseRaced as raced:
            # Another owner activated a newer version while we took the lease, or ended
            # the lease we were judging in doubt (it never sent): rolled back, nothing
            # taken or marked; read the grant again and use its version.
            return AlreadyRefreshed(raced.seen_version + 1)

    async def _refresh(self, fence: Fence, binding_id: str, generation: int,
                       endpoint: RefreshEndpoint | MintEndpoint,
                       bundle: TokenBundle, lease: LeaseWon) -> AccessToken:
        """One refresh (or mint) under the won lease. Up to the dispatch marker it is
        fenced by the claim that started it too (the marker's transaction holds the live
        WorkItem fence); from the marker on by the lease alone: once the call may have
        reached the provider (which rotates the refresh token as it answers), a claim
        that loses its trust must not cut the exchange off before activation, or the new
        token is lost with the old one spent. Its own bound is the answer wait (after
        the call left) plus the time to write the outcome, and a forced stop's deadline."""
        bound_s = (self.answer_wait_us + 2 * self.call_margin_us) / 1e6
        with trio.CancelScope(shield=True) as fenced:
            fenced.deadline = min(trio.current_time() + bound_s, self._abandon_at)
            self._exchanges.add(fenced)
            try:
                return await self._exchange(fence, binding_id, generation, endpoint,
                                            bundle, lease)
            finally:
                self._exchanges.discard(fenced)
        # Abandoned (a forced stop) or past every bound: whatever was written stands (a
        # dispatched call's lease is never taken over: its grant ends in doubt).
        raise TokenUnavailable("refresh_abandoned", "the refresh was abandoned before its"
                               " outcome was recorded")

    async def _exchange(self, fence: Fence, binding_id: str, generation: int,
                        endpoint: RefreshEndpoint | MintEndpoint,
                        bundle: TokenBundle, lease: LeaseWon) -> AccessToken:
        refreshing = isinstance(endpoint, RefreshEndpoint)
        log: dict[str, Any] = {"binding_id": binding_id, "generation": generation,
               "from_version": lease.from_version,
               "kind": "refresh" if refreshing else "mint"}
        if isinstance(endpoint, RefreshEndpoint) and bundle.refresh_token is None:
            await self._fail(binding_id, generation, lease,
                             reauthorize=grant_reason("no_refresh_token"))
            raise TokenUnavailable("needs_reauthorization", "the grant has no refresh token")
        # The request is built (and a mint's JWT signed) before the marker: nothing but
        # the send itself lies between the marker and the call.
        wait_s = self.answer_wait_us / 1e6
        request = self._request(endpoint, bundle, wait_s)
        try:
            refused = await self.store.refresh_dispatch(
                fence=fence, binding_id=binding_id, generation=generation,
                lease_token=lease.lease_token, now=self.clock.now_us)
        except StorageError as exc:
            # The marker's transaction failed or its COMMIT went unconfirmed (an answer
            # lost, or not read in time: a freeze across the COMMIT): the marker may be
            # committed, and we do not send. Say so durably, or a successor that finds
            # the marker keeps the grant in doubt with nobody to heal it.
            healed = await self._unsent_or_raise(binding_id, generation, lease, exc)
            logs.warn("token_refresh_failed", reason="marker_unconfirmed",
                      detail=type(exc).__name__, healed=healed, **log)
            raise TokenUnavailable("refresh_lease_lost", "the dispatch marker's commit was"
                                   " not confirmed, so the call was not made; nothing was"
                                   " sent") from None
        if refused is not None:
            # Nothing was sent. A lease we still hold is ended unspent, so the next owner
            # (the claim's new owner, when ours was lost) need not wait for it; a doubt a
            # successor judged from a marker of ours is undone.
            healed = await self._unsent(binding_id, generation, lease)
            logs.warn("token_refresh_failed", reason=refused.value, healed=healed, **log)
            if refused is MarkerRefused.CLAIM_LOST:
                # Frozen past the WorkItem lease while the refresh lease lived on: a
                # stale claimant stops here, as at any other fenced write (seed 5.1).
                raise LostLease(fence)
            if refused in _SUPERSEDED:
                # The binding moved (or its grant was revoked) after the lease was taken:
                # definitive, as the dispatch checkpoint's pin check is.
                code, text = _SUPERSEDED[refused]
                raise TokenUnavailable(code, f"binding {binding_id} generation {generation}:"
                                       f" {text} before the refresh call; nothing was sent")
            raise TokenUnavailable("refresh_lease_lost", "the refresh lease ended before the"
                                   " call; nothing was sent")
        answer: httpx.Response | None = None
        with trio.move_on_after(wait_s):
            try:
                answer = await self.http.send(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # No connection was made: the refresh token never left.
                healed = await self._unsent(binding_id, generation, lease)
                logs.warn("token_refresh_failed", reason="transport", detail=type(exc).__name__,
                          sent=False, healed=healed, **log)
                raise TokenUnavailable("refresh_transport", "the token endpoint could not be"
                                       " reached; nothing was sent") from None
            except httpx.HTTPError as exc:
                await self._unanswered(binding_id, generation, lease, refreshing,
                                       "refresh_transport", type(exc).__name__, log)
        if answer is None:
            await self._unanswered(binding_id, generation, lease, refreshing,
                                   "refresh_timeout", "no answer in time", log)
        assert answer is not None
        error = _error(answer) if answer.status_code in (400, 401) else ""
        if error in _DEFINITIVE_ERRORS:
            why = refused_refresh(error, False)
            await self._fail(binding_id, generation, lease, reauthorize=why)
            logs.warn("token_refresh_failed", reason=error, **log)
            # The message follows the reason code in str(exc): say why, once.
            raise TokenUnavailable("needs_reauthorization", "the token endpoint refused the"
                                   f" grant ({error})")
        if error:
            # An OAuth refusal of the request itself (its client, its form): the endpoint
            # answered before using the refresh token, which is unspent.
            await self._fail(binding_id, generation, lease, reauthorize=None)
            logs.warn("token_refresh_failed", reason="refused", status=answer.status_code,
                      **log)
            raise TokenUnavailable("refresh_refused", "the token endpoint refused the"
                                   f" request ({_safe_code(error)}); the refresh token is"
                                   " unspent")
        parsed = _parse(answer, self.clock.now_us())
        if parsed is None:
            await self._unanswered(binding_id, generation, lease, refreshing,
                                   "refresh_malformed", f"status {answer.status_code}", log)
        assert parsed is not None
        access, refresh, expires = parsed
        new_bundle = attrs.evolve(bundle, access_token=access,
                                  refresh_token=refresh or bundle.refresh_token,
                                  expires_at_us=expires)
        version = lease.from_version + 1
        sealed = seal(new_bundle, self.keys[self.active_key],
                      BundleContext(binding_id, generation, version))
        now = self.clock.now_us()
        if not await self.store.refresh_activate(
                binding_id=binding_id, generation=generation, lease_token=lease.lease_token,
                from_version=lease.from_version, sealed=sealed, expires_at_us=expires,
                now_us=now):
            logs.warn("token_refresh_failed", reason="not_activated", **log)
            raise TokenUnavailable("refresh_lease_lost", "the refresh lease ended before"
                                   " activation; another owner takes over")
        logs.event("token_refreshed", token_version=version,
                   late=now > lease.until_us, **log)
        return AccessToken(access, version)

    def _request(self, endpoint: RefreshEndpoint | MintEndpoint, bundle: TokenBundle,
                 wait_s: float) -> httpx.Request:
        """The exchange's request, read for up to ``wait_s`` (the owner's answer wait,
        whatever the shared client's own timeout)."""
        timeout = httpx.Timeout(wait_s)
        if isinstance(endpoint, MintEndpoint):
            return self.http.build_request("POST", endpoint.url, timeout=timeout, headers={
                "Authorization": f"Bearer {self._app_jwt(endpoint)}"})
        assert bundle.refresh_token is not None
        return self.http.build_request("POST", endpoint.url, timeout=timeout, data={
            "grant_type": "refresh_token",
            "refresh_token": bundle.refresh_token.reveal(),
            "client_id": endpoint.client_id,
            "client_secret": endpoint.client_secret.reveal()})

    async def _unanswered(self, binding_id: str, generation: int, lease: LeaseWon,
                          refreshing: bool, reason: str, detail: str,
                          log: dict[str, Any]) -> NoReturn:
        """The call left and its answer says nothing usable. A refresh is in doubt (the
        provider may have rotated the token): the grant says so now, the lease stays
        pinned, nobody presents the token again. A mint spends nothing: the lease ends."""
        if not refreshing:
            await self._fail(binding_id, generation, lease, reauthorize=None)
            logs.warn("token_refresh_failed", reason=reason, detail=detail, **log)
            raise TokenUnavailable(reason, "the mint endpoint gave no usable answer"
                                   f" ({detail}); the next owner mints again")
        await self.store.refresh_in_doubt(binding_id=binding_id, generation=generation,
                                          lease_token=lease.lease_token,
                                          from_version=lease.from_version,
                                          now_us=self.clock.now_us())
        logs.warn("token_refresh_in_doubt", reason=reason, detail=detail, **log)
        raise TokenUnavailable(IN_DOUBT, f"the refresh call left and got no usable answer"
                               f" ({detail}): the refresh token is possibly spent, and"
                               " nobody presents it again; re-authorize the binding")

    def _app_jwt(self, endpoint: MintEndpoint) -> str:
        """A short-lived RS256 app JWT: ``iss`` the app's S2S id (never logged)."""
        now = self.clock.now_us() // 1_000_000
        return jwt.encode({"iss": endpoint.app_id, "iat": now,
                           "exp": now + endpoint.jwt_lifetime_s},
                          endpoint.private_key_pem.reveal(), algorithm="RS256")

    async def _unsent(self, binding_id: str, generation: int, lease: LeaseWon) -> bool:
        """Our call never left and never will: end the lease unspent, and undo a doubt a
        successor judged from our marker meanwhile (True). Only where no byte of the
        request can have left."""
        return await self.store.refresh_unsent(binding_id=binding_id, generation=generation,
                                               lease_token=lease.lease_token,
                                               from_version=lease.from_version,
                                               now_us=self.clock.now_us())

    async def _unsent_or_raise(self, binding_id: str, generation: int, lease: LeaseWon,
                               cause: StorageError) -> bool:
        """:meth:`_unsent` after the marker's own transaction failed; if the database
        cannot take that either, the marker's failure is what the caller sees (a marker
        committed meanwhile then stays, as after a kill: the grant ends in doubt)."""
        try:
            return await self._unsent(binding_id, generation, lease)
        except StorageError:
            raise cause from None

    async def _fail(self, binding_id: str, generation: int, lease: LeaseWon, *,
                    reauthorize: GrantReason | None) -> None:
        await self.store.refresh_fail(binding_id=binding_id, generation=generation,
                                      lease_token=lease.lease_token,
                                      from_version=lease.from_version,
                                      reauthorize=reauthorize, now_us=self.clock.now_us())


# The token endpoint refuses the credential itself: one attempt, then re-authorization.
_DEFINITIVE_ERRORS = frozenset({"invalid_grant", "invalid_jwt"})
# A marker refused because the binding moved after the lease was taken: the definitive
# reason the work then settles with (daemon/services/credentials.py), and why.
_SUPERSEDED = {
    MarkerRefused.BINDING_MOVED: ("binding_generation", "the binding moved to another"
                                  " generation (reconnected or reinstalled)"),
    MarkerRefused.BINDING_DISCONNECTED: ("binding_disconnected", "the binding was"
                                         " disconnected"),
    MarkerRefused.GRANT_REVOKED: ("revoked", "the grant was revoked"),
}


def _unusable_text(binding_id: str, generation: int, code: str) -> str:
    if code == IN_DOUBT:
        return (f"binding {binding_id} generation {generation}: a refresh call left and was"
                " never activated; the refresh token is possibly spent by an unfinished"
                " refresh, so nobody presents it again (waiting for that refresh's answer,"
                " or re-authorization)")
    return f"binding {binding_id} generation {generation}: {code}"


def _safe_code(error: str) -> str:
    """A provider's error code, only if it looks like one (never free text)."""
    return error if error.isascii() and error.replace("_", "").isalnum() \
        and len(error) <= 40 else "unrecognised"


def _error(answer: httpx.Response) -> str:
    try:
        doc = answer.json()
    except ValueError:
        return ""
    return str(doc.get("error", "")) if isinstance(doc, dict) else ""


def _parse(answer: httpx.Response, now_us: int
           ) -> tuple[SecretText, SecretText | None, int] | None:
    """(access token, new refresh token or None, expiry) from a 200, else None."""
    if answer.status_code != 200:
        return None
    try:
        doc = answer.json()
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    # An OAuth answer names "access_token"; an S2S mint answers "token".
    access, refresh, lifetime = doc.get("access_token", doc.get("token")), \
        doc.get("refresh_token"), doc.get("expires_in")
    if not isinstance(access, str) or not access:
        return None
    if refresh is not None and not isinstance(refresh, str):
        return None
    if isinstance(lifetime, bool) or not isinstance(lifetime, int | float) \
            or not math.isfinite(lifetime) or lifetime <= 0:
        return None
    return (SecretText(access), SecretText(refresh) if refresh else None,
            now_us + int(lifetime * 1_000_000))
