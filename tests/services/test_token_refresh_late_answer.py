"""A refresh owner frozen (SIGSTOP, CPU starvation) after the provider rotated the refresh
token: its answer arrives after its lease ended (the torture run under CPU starvation,
1 run in 3: a grant needing re-authorization, 66 effects unsent, ``double_refreshes`` 1).

Before: the owner's call deadline ended before its lease, so it dropped the late answer;
the next owner took the expired lease and presented the spent refresh token again (a
double refresh: invalid_grant, and under refresh-token reuse detection a real provider
may revoke the whole grant). Now: the owner records that its call was dispatched before
sending; a successor that finds that record never calls the provider with the old token
(the grant is in doubt, visibly), and the late answer heals the grant.

The real OAuth simulator on loopback answers late (``answer_delay_s``, on trio's clock);
a manual MockClock moves time only where the test says (so neither backend's own I/O
deadlines jump while a statement is in flight)."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from config.settings import Secret
from daemon.core.grant_reasons import grant_reason
from daemon.core.token_bundle import (
    BundleContext,
    TokenKey,
    open_bundle,
)
from daemon.core.work import Fence
from daemon.services.clock import TrioClock
from daemon.services.token_refresh import (
    AccessToken,
    RefreshEndpoint,
    TokenOwner,
    TokenUnavailable,
)
from sandbox.oauth_sim import OAuthSimulator, refreshes_per_token, running_oauth, token_digest
from storage.grants import GrantState
from storage.refresh_leases import MarkerRefused
from storage.work_store import WorkStore
from tests.support.grants import expired_grant_and_claims

KEY = TokenKey("k1", bytes(range(32)))
CLIENT_SECRET = "client-SECRET-late"
SEC = 1_000_000
LEASE_S = 30


async def _setup(store: WorkStore, sim: OAuthSimulator, clock: TrioClock) -> list[Fence]:
    sim.seed("refresh-SECRET-0")
    return await expired_grant_and_claims(store, KEY, clock.now_us(), access="access-SECRET-0",
                                          refresh="refresh-SECRET-0")


def _owner(store: WorkStore, http: httpx.AsyncClient, clock: TrioClock) -> TokenOwner:
    return TokenOwner(store, {"k1": KEY}, "k1", http, clock, lease_us=LEASE_S * SEC,
                      call_margin_us=5 * SEC, wait_us=35 * SEC)


async def _refused_into(got: list[TokenUnavailable], owner: TokenOwner, fence: Fence,
                        endpoint: RefreshEndpoint) -> None:
    """Ask ``owner`` for b1's token, which must be refused; keep why in ``got``."""
    with pytest.raises(TokenUnavailable) as info:
        await owner.access_token(fence, "b1", 1, endpoint)
    got.append(info.value)


async def test_an_owner_whose_answer_arrives_after_its_lease_heals_the_grant_and_nobody_presents_the_token_twice(  # noqa: E501
        store: WorkStore, mock_clock: trio.testing.MockClock) -> None:
    clock = TrioClock()
    async with running_oauth(CLIENT_SECRET) as (sim, url):
        first_fence, second_fence = await _setup(store, sim, clock)
        endpoint = RefreshEndpoint(url, "client-1", Secret(CLIENT_SECRET))
        sim.answer_delay_s = LEASE_S + 10  # rotated at once, answered after the lease
        first_got: list[AccessToken | TokenUnavailable] = []
        async with httpx.AsyncClient() as http:
            first, second = _owner(store, http, clock), _owner(store, http, clock)

            async def first_owner() -> None:
                try:
                    first_got.append(await first.access_token(first_fence, "b1", 1,
                                                              endpoint))
                except TokenUnavailable as exc:
                    first_got.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(first_owner)
                await sim.called.wait()  # the provider rotated; its answer is late
                mock_clock.jump(LEASE_S + 1)  # the first owner's lease is over
                with pytest.raises(TokenUnavailable) as doubt:
                    await second.access_token(second_fence, "b1", 1, endpoint)
                # The successor never presents the possibly spent refresh token.
                assert refreshes_per_token(sim.journal) == {
                    token_digest("refresh-SECRET-0"): 1}
                assert doubt.value.reason == "refresh_in_doubt"
                assert "SECRET" not in str(doubt.value)
                # Visible on the grant (console, binding show, the gauge) while in doubt.
                grant = await store.grant_get("b1", 1)
                assert grant is not None
                assert (grant.state, grant.token_version, grant.reason) == (
                    GrantState.NEEDS_REAUTHORIZATION, 1, grant_reason("refresh_in_doubt"))
                mock_clock.jump(10)  # the late answer arrives
            (late,) = first_got
            assert isinstance(late, AccessToken), late
            assert late.token_version == 2
            # Healed without an operator: valid at the new version, the reason cleared.
            grant = await store.grant_get("b1", 1)
            assert grant is not None
            assert (grant.state, grant.token_version, grant.reason) == (
                GrantState.VALID, 2, None)
            stored = open_bundle(grant.sealed, {"k1": KEY}, BundleContext("b1", 1, 2))
            assert stored.refresh_token is not None
            assert stored.refresh_token.reveal() in sim.valid_refresh
            # The successor now uses the new version, without calling the provider.
            again = await second.access_token(second_fence, "b1", 1, endpoint)
    assert again == late
    assert len(sim.journal) == 1
    assert await store.refresh_count("b1", 1) == 1


async def test_a_forced_stop_abandons_an_unfinished_refresh_and_its_grant_stays_in_doubt(
        store: WorkStore, mock_clock: trio.testing.MockClock) -> None:
    """The answer wait is bounded by a forced stop's deadline (``abandon_at``): the
    exchange ends there, its marker stays, and the next owner does not call."""
    clock = TrioClock()
    async with running_oauth(CLIENT_SECRET) as (sim, url):
        first_fence, second_fence = await _setup(store, sim, clock)
        endpoint = RefreshEndpoint(url, "client-1", Secret(CLIENT_SECRET))
        sim.answer_delay_s = 60
        async with httpx.AsyncClient() as http:
            first, second = _owner(store, http, clock), _owner(store, http, clock)
            got: list[TokenUnavailable] = []

            async with trio.open_nursery() as nursery:
                nursery.start_soon(_refused_into, got, first, first_fence, endpoint)
                await sim.called.wait()
                first.abandon_at(trio.current_time() + 2)
                mock_clock.jump(3)
            (abandoned,) = got
            assert abandoned.reason == "refresh_abandoned"
            mock_clock.jump(LEASE_S)
            with pytest.raises(TokenUnavailable) as doubt:
                await second.access_token(second_fence, "b1", 1, endpoint)
    assert doubt.value.reason == "refresh_in_doubt"
    assert refreshes_per_token(sim.journal) == {token_digest("refresh-SECRET-0"): 1}


async def test_an_owner_whose_lease_was_taken_over_before_its_marker_never_calls(
        store: WorkStore, mock_clock: trio.testing.MockClock) -> None:
    """Frozen between taking the lease and writing the dispatch marker, past its lease:
    a successor took the lease over (the token never left, so it may) and refreshed.
    The first owner cannot write its marker, so it sends nothing."""
    clock = TrioClock()
    async with running_oauth(CLIENT_SECRET) as (sim, url):
        first_fence, second_fence = await _setup(store, sim, clock)
        endpoint = RefreshEndpoint(url, "client-1", Secret(CLIENT_SECRET))
        async with httpx.AsyncClient() as http:
            first, second = _owner(store, http, clock), _owner(store, http, clock)
            frozen, thawed = trio.Event(), trio.Event()
            marker = store.refresh_dispatch

            async def frozen_before_marker(**kw: object) -> MarkerRefused | None:
                frozen.set()
                await thawed.wait()
                return await marker(**kw)  # type: ignore[arg-type]

            got: list[TokenUnavailable] = []

            async with trio.open_nursery() as nursery:
                setattr(store, "refresh_dispatch", frozen_before_marker)  # noqa: B010
                nursery.start_soon(_refused_into, got, first, first_fence, endpoint)
                await frozen.wait()
                setattr(store, "refresh_dispatch", marker)  # noqa: B010
                mock_clock.jump(LEASE_S + 1)
                token = await second.access_token(second_fence, "b1", 1, endpoint)
                thawed.set()
            assert token.token_version == 2
    (lost,) = got
    assert lost.reason == "refresh_lease_lost"
    assert "nothing was sent" in str(lost)
    assert refreshes_per_token(sim.journal) == {token_digest("refresh-SECRET-0"): 1}
    grant = await store.grant_get("b1", 1)
    assert grant is not None and (grant.state, grant.token_version) == (GrantState.VALID, 2)
