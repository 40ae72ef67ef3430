"""The token owner: a usable access token for a live claim, refreshed by one winner (seed 8.2).

Theory of operation
-------------------
:meth:`TokenOwner.access_token` is called by a handler that holds a live WorkItem fence and
needs the binding generation's access token:

1. Read the grant. Unusable (none, needs re-authorization, revoked): fail closed with that
   reason. Not expiring within ``margin``, and not the version a provider 401 rejected:
   open the bundle and return it.
2. Otherwise take the refresh lease *inside the fenced transaction* (a stale claimant can
   change nothing, so it never reaches the provider). Losers wait, bounded, for the next
   token version and use it; nobody else calls the provider while a lease is live.
3. The winner calls the token endpoint once, under a deadline that ends before its lease
   (so it can never activate after someone else could have taken over), then installs the
   next bundle and version and ends the lease in one transaction.
4. ``invalid_grant``: the grant needs re-authorization (one attempt, never a loop; when a
   crashed owner's refresh from the same version never finished, the reason says the
   refresh token was possibly spent). A timeout or a malformed answer leaves the lease to
   expire, so the next owner knows the token may be spent. A response without a new
   refresh token keeps the old one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import httpx
import jwt
import trio

from config.settings import Secret
from daemon.core.grant_reasons import GrantReason, grant_reason, refused_refresh
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
from storage.port import DuplicateKey, SqlTx
from storage.refresh_leases import (
    AlreadyRefreshed,
    GrantUnusable,
    LeaseBusy,
    LeaseWon,
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
    # The refresh lease; the provider call's deadline ends ``call_margin`` before it.
    lease_us: int = 30_000_000
    call_margin_us: int = 5_000_000
    # How long a loser waits for the winner's new version before giving up (closed).
    wait_us: int = 35_000_000
    poll_s: float = 0.05

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
                raise TokenUnavailable(grant.state.value, f"binding {binding_id} generation"
                                       f" {generation}: {grant.state.value}")
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
            outcome = await self._take_lease(fence, binding_id, generation, grant.token_version)
            if isinstance(outcome, GrantUnusable):
                raise TokenUnavailable(outcome.reason, f"binding {binding_id}: {outcome.reason}")
            if isinstance(outcome, AlreadyRefreshed):
                continue
            if isinstance(outcome, LeaseBusy):
                if self.clock.now_us() - waited_from > self.wait_us:
                    raise TokenUnavailable("refresh_wait_timeout",
                                           "another replica's refresh did not finish in time")
                await trio.sleep(self.poll_s)
                continue
            return await self._refresh(binding_id, generation, endpoint, bundle, outcome)

    async def _take_lease(self, fence: Fence, binding_id: str, generation: int,
                          seen_version: int) -> LeaseWon | AlreadyRefreshed | LeaseBusy | \
            GrantUnusable:
        token = new_lease_token()
        now = self.clock.now_us()

        async def body(tx: SqlTx) -> LeaseWon | AlreadyRefreshed | LeaseBusy | GrantUnusable:
            return await refresh_lease_acquire(
                tx, binding_id=binding_id, generation=generation, seen_version=seen_version,
                lease_token=token, work_id=fence.work_id, epoch=fence.ownership_epoch,
                ttl_us=self.lease_us, now_us=now)

        try:
            return await self.store.work_fenced(fence, now, body, name="refresh.lease")
        except DuplicateKey:
            return LeaseBusy(now)  # two first owners created the lease row at once
        except RefreshLeaseRaced as raced:
            # Another owner activated a newer version while we took the lease: rolled
            # back, nothing taken; read the grant again and use its version.
            return AlreadyRefreshed(raced.seen_version + 1)

    async def _refresh(self, binding_id: str, generation: int,
                       endpoint: RefreshEndpoint | MintEndpoint,
                       bundle: TokenBundle, lease: LeaseWon) -> AccessToken:
        """One refresh (or mint) under the won lease. It is fenced by that lease, not by
        the claim that started it: once the call may have reached the provider (which
        rotates the refresh token as it answers), a claim that loses its trust must not
        cut the exchange off before activation, or the new token is lost with the old one
        spent. Only the lease's end bounds it (the call's own deadline ends
        ``call_margin`` earlier, which leaves activation its time)."""
        with trio.CancelScope(shield=True) as fenced:
            left_s = (lease.until_us - self.clock.now_us()) / 1e6
            fenced.deadline = trio.current_time() + max(0.0, left_s)
            return await self._exchange(binding_id, generation, endpoint, bundle, lease)
        raise TokenUnavailable("refresh_lease_lost", "the refresh lease ended before"
                               " activation; another owner takes over")

    async def _exchange(self, binding_id: str, generation: int,
                        endpoint: RefreshEndpoint | MintEndpoint,
                        bundle: TokenBundle, lease: LeaseWon) -> AccessToken:
        log: dict[str, Any] = {"binding_id": binding_id, "generation": generation,
               "from_version": lease.from_version,
               "kind": "mint" if isinstance(endpoint, MintEndpoint) else "refresh"}
        if isinstance(endpoint, RefreshEndpoint) and bundle.refresh_token is None:
            await self._fail(binding_id, generation, lease,
                             reauthorize=grant_reason("no_refresh_token"))
            raise TokenUnavailable("needs_reauthorization", "the grant has no refresh token")
        deadline_s = (lease.until_us - self.call_margin_us - self.clock.now_us()) / 1e6
        answer: httpx.Response | None = None
        with trio.move_on_after(max(0.0, deadline_s)):
            try:
                if isinstance(endpoint, MintEndpoint):
                    answer = await self.http.post(endpoint.url, headers={
                        "Authorization": f"Bearer {self._app_jwt(endpoint)}"})
                else:
                    assert bundle.refresh_token is not None
                    answer = await self.http.post(endpoint.url, data={
                        "grant_type": "refresh_token",
                        "refresh_token": bundle.refresh_token.reveal(),
                        "client_id": endpoint.client_id,
                        "client_secret": endpoint.client_secret.reveal()})
            except httpx.HTTPError as exc:
                logs.warn("token_refresh_failed", reason="transport", detail=type(exc).__name__,
                          **log)
                raise TokenUnavailable("refresh_transport", "the token endpoint could not be"
                                       " reached; the lease is left to expire") from None
        if answer is None:
            logs.warn("token_refresh_failed", reason="timeout", **log)
            raise TokenUnavailable("refresh_timeout", "the token endpoint did not answer in"
                                   " time; the refresh token may be spent")
        if answer.status_code in (400, 401) and _error(answer) in _DEFINITIVE_ERRORS:
            why = refused_refresh(_error(answer), lease.possibly_spent)
            await self._fail(binding_id, generation, lease, reauthorize=why)
            # The message follows the reason code in str(exc): say why, once.
            reason = ("the token endpoint refused the refresh token, possibly spent by an"
                      " unfinished refresh" if lease.possibly_spent
                      else f"the token endpoint refused the grant ({_error(answer)})")
            logs.warn("token_refresh_failed", reason="invalid_grant",
                      possibly_spent=lease.possibly_spent, **log)
            raise TokenUnavailable("needs_reauthorization", reason)
        parsed = _parse(answer, self.clock.now_us())
        if parsed is None:
            logs.warn("token_refresh_failed", reason="malformed", status=answer.status_code,
                      **log)
            raise TokenUnavailable("refresh_malformed", "the token endpoint's answer was not"
                                   " a token; the lease is left to expire")
        access, refresh, expires = parsed
        new_bundle = attrs.evolve(bundle, access_token=access,
                                  refresh_token=refresh or bundle.refresh_token,
                                  expires_at_us=expires)
        version = lease.from_version + 1
        sealed = seal(new_bundle, self.keys[self.active_key],
                      BundleContext(binding_id, generation, version))
        if not await self.store.refresh_activate(
                binding_id=binding_id, generation=generation, lease_token=lease.lease_token,
                from_version=lease.from_version, sealed=sealed, expires_at_us=expires,
                now_us=self.clock.now_us()):
            raise TokenUnavailable("refresh_lease_lost", "the refresh lease ended before"
                                   " activation; another owner takes over")
        logs.event("token_refreshed", token_version=version, **log)
        return AccessToken(access, version)

    def _app_jwt(self, endpoint: MintEndpoint) -> str:
        """A short-lived RS256 app JWT: ``iss`` the app's S2S id (never logged)."""
        now = self.clock.now_us() // 1_000_000
        return jwt.encode({"iss": endpoint.app_id, "iat": now,
                           "exp": now + endpoint.jwt_lifetime_s},
                          endpoint.private_key_pem.reveal(), algorithm="RS256")

    async def _fail(self, binding_id: str, generation: int, lease: LeaseWon, *,
                    reauthorize: GrantReason) -> None:
        await self.store.refresh_fail(binding_id=binding_id, generation=generation,
                                      lease_token=lease.lease_token,
                                      from_version=lease.from_version,
                                      reauthorize=reauthorize, now_us=self.clock.now_us())


# The token endpoint refuses the credential itself: one attempt, then re-authorization.
_DEFINITIVE_ERRORS = frozenset({"invalid_grant", "invalid_jwt"})


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
