"""The token owner against a real OAuth endpoint (rotating refresh tokens) and a real
database: one refresh per token version, fail closed on every bad answer, nothing leaked."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio

from config.settings import Secret
from daemon.core.grant_reasons import grant_reason
from daemon.core.token_bundle import (
    BundleContext,
    BundleRefused,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    seal,
)
from daemon.core.work import Fence
from daemon.services.clock import WallClock
from daemon.services.token_refresh import RefreshEndpoint, TokenOwner, TokenUnavailable
from sandbox.oauth_sim import OAuthSimulator, refreshes_per_token, running_oauth, token_digest
from storage.grants import GrantState
from storage.port import LostLease
from storage.work_store import WorkStore
from tests.support.work import claim, enqueue

KEY = TokenKey("k1", bytes(range(32)))
CLIENT_SECRET = "client-SECRET-x"
CLOCK = WallClock()


@pytest.fixture
async def oauth() -> AsyncIterator[tuple[OAuthSimulator, str]]:
    async with running_oauth(CLIENT_SECRET) as running:
        yield running


async def _setup(store: WorkStore, sim: OAuthSimulator, *, expired: bool,
                 items: int = 1) -> list[Fence]:
    now = CLOCK.now_us()
    sim.seed("refresh-SECRET-0")
    bundle = TokenBundle(access_token=SecretText("access-SECRET-0"),
                         refresh_token=SecretText("refresh-SECRET-0"),
                         expires_at_us=now + (-1 if expired else 3_600_000_000))
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(bundle, KEY, BundleContext("b1", 1, 1)),
                              expires_at_us=bundle.expires_at_us, now_us=now)
    await enqueue(store, items, now=now)
    got = await claim(store, now=now, limit=items)
    return [i.fence for i in got.claimed if i.fence is not None]


def _owner(store: WorkStore, http: httpx.AsyncClient, **kw: int) -> TokenOwner:
    kw.setdefault("answer_wait_us", 10_000_000)
    return TokenOwner(store, {"k1": KEY}, "k1", http, CLOCK, **kw)


def _endpoint(url: str) -> RefreshEndpoint:
    return RefreshEndpoint(url, "client-1", Secret(CLIENT_SECRET))


async def test_a_valid_token_is_used_without_calling_the_provider(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=False)
    async with httpx.AsyncClient() as http:
        got = await _owner(store, http).access_token(fence, "b1", 1, _endpoint(url))
    assert (got.token.reveal(), got.token_version) == ("access-SECRET-0", 1)
    assert sim.journal == []


async def test_many_claimants_see_an_expired_token_one_refresh_reaches_the_provider(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    fences = await _setup(store, sim, expired=True, items=8)
    got: list[tuple[str, int]] = []
    async with httpx.AsyncClient() as http:
        owner = _owner(store, http)

        async def one(fence: Fence) -> None:
            token = await owner.access_token(fence, "b1", 1, _endpoint(url))
            got.append((token.token.reveal(), token.token_version))

        async with trio.open_nursery() as nursery:
            for fence in fences:
                nursery.start_soon(one, fence)
    assert len(got) == 8 and {v for _, v in got} == {2}
    assert len({t for t, _ in got}) == 1 and got[0][0] in sim.access_tokens
    assert refreshes_per_token(sim.journal) == {token_digest("refresh-SECRET-0"): 1}
    grant = await store.grant_get("b1", 1)
    assert grant is not None and grant.token_version == 2
    stored = open_bundle(grant.sealed, {"k1": KEY}, BundleContext("b1", 1, 2))
    # The rotated refresh token replaced the old one, which the provider no longer honours.
    assert stored.refresh_token is not None and stored.refresh_token.reveal() in sim.valid_refresh
    assert "refresh-SECRET-0" not in sim.valid_refresh
    assert await store.refresh_count("b1", 1) == 1


async def test_a_401_on_the_current_version_refreshes_once(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=False)
    async with httpx.AsyncClient() as http:
        owner = _owner(store, http)
        fresh = await owner.access_token(fence, "b1", 1, _endpoint(url), rejected_version=1)
        assert fresh.token_version == 2
        # A second 401 report about version 1 uses version 2, no new refresh.
        again = await owner.access_token(fence, "b1", 1, _endpoint(url), rejected_version=1)
    assert again == fresh and len(sim.journal) == 1


async def test_an_answer_without_a_new_refresh_token_keeps_the_old_one(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    sim.rotate = False
    (fence,) = await _setup(store, sim, expired=True)
    async with httpx.AsyncClient() as http:
        assert (await _owner(store, http).access_token(fence, "b1", 1,
                                                       _endpoint(url))).token_version == 2
    grant = await store.grant_get("b1", 1)
    assert grant is not None
    kept = open_bundle(grant.sealed, {"k1": KEY}, BundleContext("b1", 1, 2)).refresh_token
    assert kept is not None and kept.reveal() == "refresh-SECRET-0"


async def test_invalid_grant_needs_reauthorization_after_one_attempt(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=True)
    sim.valid_refresh.clear()  # revoked at the provider
    async with httpx.AsyncClient() as http:
        owner = _owner(store, http)
        with pytest.raises(TokenUnavailable) as info:
            await owner.access_token(fence, "b1", 1, _endpoint(url))
        assert info.value.reason == "needs_reauthorization"
        with pytest.raises(TokenUnavailable) as again:
            await owner.access_token(fence, "b1", 1, _endpoint(url))
    assert again.value.reason == "needs_reauthorization"
    assert len(sim.journal) == 1  # never a retry loop
    grant = await store.grant_get("b1", 1)
    assert grant is not None and grant.state is GrantState.NEEDS_REAUTHORIZATION
    # Why, durably on the grant (a stable code and its sentence, no secret).
    assert grant.reason == grant_reason("invalid_grant")
    assert "SECRET" not in grant.reason.text


@pytest.mark.parametrize("behaviour", ["hang", "malformed"])
async def test_a_hung_or_malformed_endpoint_puts_the_grant_in_doubt_and_nobody_calls_again(
        store: WorkStore, oauth: tuple[OAuthSimulator, str], behaviour: str) -> None:
    """The call left and its answer says nothing of the refresh token (none in time, or
    not a token): the provider may have rotated it, so nobody presents it again. The
    grant says so at once (before: the lease was left to expire and the next owner
    presented the possibly spent token, a double refresh)."""
    sim, url = oauth
    setattr(sim, behaviour, True)
    fences = await _setup(store, sim, expired=True, items=2)
    async with httpx.AsyncClient() as http:
        owner = _owner(store, http, lease_us=1_500_000, call_margin_us=500_000,
                       answer_wait_us=1_000_000)
        with pytest.raises(TokenUnavailable) as info:
            await owner.access_token(fences[0], "b1", 1, _endpoint(url))
        assert info.value.reason == "refresh_in_doubt"
        setattr(sim, behaviour, False)
        with pytest.raises(TokenUnavailable) as doubt:
            await owner.access_token(fences[1], "b1", 1, _endpoint(url))
    assert doubt.value.reason == "refresh_in_doubt"
    assert "possibly spent" in str(info.value) and "possibly spent" in str(doubt.value)
    assert "SECRET" not in str(info.value) + str(doubt.value)
    assert refreshes_per_token(sim.journal) == {token_digest("refresh-SECRET-0"): 1}
    grant = await store.grant_get("b1", 1)
    assert grant is not None and grant.reason is not None
    assert (grant.state, grant.token_version, grant.reason) == (
        GrantState.NEEDS_REAUTHORIZATION, 1, grant_reason("refresh_in_doubt"))
    assert "possibly spent" in grant.reason.text


async def test_a_call_that_never_connected_leaves_the_token_unspent_for_the_next_owner(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    """No connection was made: the dispatch marker was written, but nothing left, so the
    lease ends unspent and the next owner refreshes at once (no wait, no doubt)."""
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=True)
    async with httpx.AsyncClient() as http:
        owner = _owner(store, http)
        closed = RefreshEndpoint("http://127.0.0.1:9/oauth/v1/token", "client-1",
                                 Secret(CLIENT_SECRET))
        with pytest.raises(TokenUnavailable) as info:
            await owner.access_token(fence, "b1", 1, closed)
        assert info.value.reason == "refresh_transport"
        assert not await store.refresh_in_flight("b1", 1, CLOCK.now_us())
        got = await owner.access_token(fence, "b1", 1, _endpoint(url))
    assert got.token_version == 2
    assert refreshes_per_token(sim.journal) == {token_digest("refresh-SECRET-0"): 1}


async def test_an_expired_grant_without_a_refresh_token_says_so_on_the_grant(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=True)
    now = CLOCK.now_us()
    bare = TokenBundle(access_token=SecretText("access-SECRET-1"), expires_at_us=now - 1)
    assert await store.grant_replace(binding_id="b1", generation=1, expected_version=1,
                                     sealed=seal(bare, KEY, BundleContext("b1", 1, 2)),
                                     expires_at_us=now - 1, now_us=now, refreshed=False)
    async with httpx.AsyncClient() as http:
        with pytest.raises(TokenUnavailable) as info:
            await _owner(store, http).access_token(fence, "b1", 1, _endpoint(url))
    assert info.value.reason == "needs_reauthorization"
    assert sim.journal == []  # nothing to refresh with: the provider is never called
    grant = await store.grant_get("b1", 1)
    assert grant is not None and (grant.state, grant.reason, grant.token_version) == (
        GrantState.NEEDS_REAUTHORIZATION, grant_reason("no_refresh_token"), 2)


async def test_a_bundle_that_fails_authentication_is_refused_here_and_marks_nothing(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=False)
    async with httpx.AsyncClient() as http:
        # A key this replica lacks is its own configuration: the grant is not marked.
        lacking = TokenOwner(store, {"k2": TokenKey("k2", bytes(32))}, "k2", http, CLOCK)
        with pytest.raises(BundleRefused) as missing:
            await lacking.access_token(fence, "b1", 1, _endpoint(url))
        assert missing.value.reason == "token_key_missing"
        grant = await store.grant_get("b1", 1)
        assert grant is not None and (grant.state, grant.reason) == (GrantState.VALID, None)
        # The same key id with other material: the bundle fails authentication.
        wrong = TokenOwner(store, {"k1": TokenKey("k1", bytes(range(1, 33)))}, "k1", http,
                           CLOCK)
        with pytest.raises(BundleRefused) as refused:
            await wrong.access_token(fence, "b1", 1, _endpoint(url))
        assert refused.value.reason == "token_bundle_unauthentic"
        # Neither marks the shared grant (this replica's wrong key is indistinguishable
        # from a tampered bundle): a replica with the right key still uses it.
        grant = await store.grant_get("b1", 1)
        assert grant is not None and (grant.state, grant.reason) == (GrantState.VALID, None)
        token = await _owner(store, http).access_token(fence, "b1", 1, _endpoint(url))
    assert (token.token.reveal(), token.token_version) == ("access-SECRET-0", 1)
    assert sim.journal == []  # nothing refreshed, by either


async def test_a_stale_claimant_never_reaches_the_token_endpoint(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=True)
    stale = Fence(fence.work_id, "not-our-token", fence.ownership_epoch)
    async with httpx.AsyncClient() as http:
        with pytest.raises(LostLease):
            await _owner(store, http).access_token(stale, "b1", 1, _endpoint(url))
    assert sim.journal == []


async def test_no_grant_and_a_wrong_client_are_clear(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=True)
    async with httpx.AsyncClient() as http:
        owner = _owner(store, http)
        with pytest.raises(TokenUnavailable) as none:
            await owner.access_token(fence, "b1", 9, _endpoint(url))
        assert none.value.reason == "no_grant"
        bad = RefreshEndpoint(url, "client-1", Secret("wrong"))
        with pytest.raises(TokenUnavailable) as wrong:
            await owner.access_token(fence, "b1", 1, bad)
        # Refused before the refresh token was used: the lease ends unspent, and the
        # right client refreshes with the same token at once.
        assert (await owner.access_token(fence, "b1", 1, _endpoint(url))).token_version == 2
    assert wrong.value.reason == "refresh_refused"
    assert str(wrong.value) == ("refresh_refused: the token endpoint refused the request"
                                " (invalid_client); the refresh token is unspent")
    assert "wrong" not in str(wrong.value)
    assert [e["answer"] for e in sim.journal] == ["invalid_client", "ok"]



class _AnswerHeld(httpx.AsyncBaseTransport):
    """The real endpoint's answer, held on its way back until ``release``: the provider
    has already rotated the refresh token when ``answered`` is set."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.answered = trio.Event()
        self.release = trio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        await response.aread()
        self.answered.set()
        await self.release.wait()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_refresh_cut_off_by_its_claim_after_the_provider_answered_still_activates(
        store: WorkStore, oauth: tuple[OAuthSimulator, str]) -> None:
    """The claim that started a refresh loses its trust (its handler's cancel scope ends)
    after the provider rotated the refresh token: the refresh is fenced by its own lease,
    not by the claim, so it still activates the new version. (Before: the cancellation
    dropped the answer, the grant kept the spent refresh token, and the next owner's
    refresh was invalid_grant: the grant needed re-authorization; found by the torture
    run on Galera and MariaDB.)"""
    sim, url = oauth
    (fence,) = await _setup(store, sim, expired=True)
    transport = _AnswerHeld()
    async with httpx.AsyncClient(transport=transport) as http:
        owner = _owner(store, http)
        claim_scope = trio.CancelScope()

        async def claimed() -> None:
            with claim_scope:
                await owner.access_token(fence, "b1", 1, _endpoint(url))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(claimed)
            await transport.answered.wait()
            claim_scope.cancel()  # the claim's trust horizon passed mid-exchange
            transport.release.set()
    grant = await store.grant_get("b1", 1)
    assert grant is not None and (grant.state, grant.token_version) == (GrantState.VALID, 2)
    stored = open_bundle(grant.sealed, {"k1": KEY}, BundleContext("b1", 1, 2))
    assert stored.refresh_token is not None and stored.refresh_token.reveal() in sim.valid_refresh
    assert refreshes_per_token(sim.journal) == {token_digest("refresh-SECRET-0"): 1}
