"""A claimant that took the refresh lease, was frozen past its WorkItem lease and woke after
another replica reclaimed the item (issue 20 item 1; seed 5.1, 8.2).

Before: the dispatch marker checked only the refresh lease (still live: it outlasts the
WorkItem lease here), so the stale claimant wrote it, called the token endpoint and
activated the next token version. Now: the marker is written only under the live WorkItem
fence, in the same transaction; the stale claimant stops with ``LostLease`` (reason
``claim_lost_before_call`` in its log), nothing reaches the endpoint, its refresh lease
ends unspent, and the replica that reclaimed the item refreshes once.

The real OAuth simulator on loopback; a manual MockClock moves time only where the test
says."""

from __future__ import annotations

import httpx
import trio
import trio.testing

from config.settings import Secret
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.services.clock import TrioClock
from daemon.services.token_refresh import RefreshEndpoint, TokenOwner
from sandbox.oauth_sim import refreshes_per_token, running_oauth, token_digest
from storage.grants import GrantState
from storage.port import LostLease
from storage.refresh_leases import MarkerRefused
from storage.work_store import WorkStore
from tests.support.work import claim, enqueue

KEY = TokenKey("k1", bytes(range(32)))
CLIENT_SECRET = "client-SECRET-stale"
SEC = 1_000_000
CLAIM_S = 20  # the WorkItem lease: shorter than what is left of the refresh lease
LEASE_S = 30  # the refresh lease


async def test_stale_claimant_reclaimed_before_marker_never_reaches_token_endpoint(
        store: WorkStore, mock_clock: trio.testing.MockClock) -> None:
    clock = TrioClock()
    now = clock.now_us()
    async with running_oauth(CLIENT_SECRET) as (sim, url):
        sim.seed("refresh-SECRET-0")
        bundle = TokenBundle(access_token=SecretText("access-SECRET-0"),
                             refresh_token=SecretText("refresh-SECRET-0"),
                             expires_at_us=now - 1)
        await store.grant_install(binding_id="b1", generation=1,
                                  sealed=seal(bundle, KEY, BundleContext("b1", 1, 1)),
                                  expires_at_us=now - 1, now_us=now)
        (work_id,) = await enqueue(store, 1, now=now)
        (stale_item,) = (await claim(store, owner="A", now=now, ttl=CLAIM_S * SEC)).claimed
        assert stale_item.fence is not None
        endpoint = RefreshEndpoint(url, "client-1", Secret(CLIENT_SECRET))
        async with httpx.AsyncClient() as http:
            stale, fresh = (TokenOwner(store, {"k1": KEY}, "k1", http, clock,
                                       lease_us=LEASE_S * SEC, call_margin_us=5 * SEC,
                                       wait_us=35 * SEC) for _ in range(2))
            frozen, thawed = trio.Event(), trio.Event()
            marker = store.refresh_dispatch

            async def frozen_before_marker(**kw: object) -> MarkerRefused | None:
                frozen.set()
                await thawed.wait()
                return await marker(**kw)  # type: ignore[arg-type]

            outcome: list[object] = []

            async def stale_claimant() -> None:
                assert stale_item.fence is not None
                try:
                    outcome.append(await stale.access_token(stale_item.fence, "b1", 1,
                                                            endpoint))
                except LostLease as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as nursery:
                setattr(store, "refresh_dispatch", frozen_before_marker)  # noqa: B010
                nursery.start_soon(stale_claimant)
                await frozen.wait()  # the refresh lease is ours; the marker is not written
                setattr(store, "refresh_dispatch", marker)  # noqa: B010
                mock_clock.jump(CLAIM_S + 1)  # past the WorkItem lease, not the refresh's
                assert await store.refresh_in_flight("b1", 1, clock.now_us())
                (reclaimed,) = (await claim(store, owner="B", now=clock.now_us())).claimed
                assert reclaimed.work_id == work_id and reclaimed.fence is not None
                assert reclaimed.fence.ownership_epoch > stale_item.fence.ownership_epoch
                thawed.set()
            (stopped,) = outcome
            assert isinstance(stopped, LostLease), stopped
            assert sim.journal == []  # the stale claimant never reached the endpoint
            grant = await store.grant_get("b1", 1)
            assert grant is not None
            assert (grant.state, grant.token_version) == (GrantState.VALID, 1)
            # Nothing left, so its refresh lease ended unspent: the live claim refreshes
            # at once, once.
            assert not await store.refresh_in_flight("b1", 1, clock.now_us())
            token = await fresh.access_token(reclaimed.fence, "b1", 1, endpoint)
    assert token.token_version == 2
    assert refreshes_per_token(sim.journal) == {token_digest("refresh-SECRET-0"): 1}
    assert await store.refresh_count("b1", 1) == 1

