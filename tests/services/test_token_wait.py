"""A claimant whose binding's refresh is held by another owner waits for the winner's new
version, bounded, and uses it; at the bound it gives up with a stable reason (issue 9
item 3: "others wait (bounded) for the new version and use it"). MockClock drives the
wait (``TrioClock``), the database is real; nobody but the winner reaches a provider
(the endpoint here is a closed port: a call would be a transport failure)."""

from __future__ import annotations

import httpx
import pytest
import trio

from config.settings import Secret
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.core.work import Fence
from daemon.services.clock import TrioClock
from daemon.services.token_refresh import (
    RefreshEndpoint,
    TokenOwner,
    TokenUnavailable,
)
from storage.refresh_leases import LeaseWon
from storage.work_store import WorkStore
from tests.support.grants import expired_grant_and_claims


@pytest.fixture
def backend() -> str:
    """SQLite only: under MockClock's autojump a network adapter's own I/O deadlines
    jump too (MariaDB's 15 s answer timeout fires at once); the lease and CAS logic is
    the conformance suite's, run on every backend in tests/storage/."""
    return "sqlite"


KEY = TokenKey("k1", bytes(range(32)))
NOWHERE = RefreshEndpoint("http://127.0.0.1:9/oauth/v1/token", "client-1", Secret("c"))
SEC = 1_000_000


async def _setup(store: WorkStore, clock: TrioClock) -> list[Fence]:
    return await expired_grant_and_claims(store, KEY, clock.now_us(), access="access-SECRET-1",
                                          refresh="refresh-SECRET-1")


def _owner(store: WorkStore, http: httpx.AsyncClient, clock: TrioClock, *, lease_s: int,
           wait_s: int) -> TokenOwner:
    return TokenOwner(store, {"k1": KEY}, "k1", http, clock, lease_us=lease_s * SEC,
                      call_margin_us=SEC, wait_us=wait_s * SEC)


async def _hold(owner: TokenOwner, fence: Fence) -> LeaseWon:
    """Another owner's refresh in flight: its lease (the in-flight record) is taken."""
    won = await owner._take_lease(fence, "b1", 1, 1)
    assert isinstance(won, LeaseWon)
    return won


async def test_a_waiter_uses_the_winners_new_version(store: WorkStore,
                                                     autojump_clock: trio.testing.MockClock
                                                     ) -> None:
    clock = TrioClock()
    holder_fence, waiter_fence = await _setup(store, clock)
    async with httpx.AsyncClient() as http:
        holder = _owner(store, http, clock, lease_s=60, wait_s=10)
        waiter = _owner(store, http, clock, lease_s=60, wait_s=10)
        lease = await _hold(holder, holder_fence)
        started = trio.current_time()
        got: list[object] = []

        async def wait() -> None:
            got.append(await waiter.access_token(waiter_fence, "b1", 1, NOWHERE))
            got.append(trio.current_time() - started)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.sleep(3)
            new = TokenBundle(access_token=SecretText("access-SECRET-2"),
                              refresh_token=SecretText("refresh-SECRET-2"),
                              expires_at_us=clock.now_us() + 3600 * SEC)
            assert await store.refresh_activate(
                binding_id="b1", generation=1, lease_token=lease.lease_token, from_version=1,
                sealed=seal(new, KEY, BundleContext("b1", 1, 2)),
                expires_at_us=new.expires_at_us, now_us=clock.now_us())
    token, waited = got
    assert getattr(token, "token_version") == 2  # noqa: B009
    assert getattr(token, "token").reveal() == "access-SECRET-2"  # noqa: B009
    assert isinstance(waited, float) and 3 <= waited < 10


async def test_a_waiter_gives_up_at_its_bound_with_a_stable_reason(
        store: WorkStore, autojump_clock: trio.testing.MockClock) -> None:
    clock = TrioClock()
    holder_fence, waiter_fence = await _setup(store, clock)
    async with httpx.AsyncClient() as http:
        holder = _owner(store, http, clock, lease_s=60, wait_s=10)
        waiter = _owner(store, http, clock, lease_s=60, wait_s=10)
        await _hold(holder, holder_fence)
        started = trio.current_time()
        with pytest.raises(TokenUnavailable) as info:
            await waiter.access_token(waiter_fence, "b1", 1, NOWHERE)
        waited = trio.current_time() - started
    assert info.value.reason == "refresh_wait_timeout"
    assert str(info.value) == ("refresh_wait_timeout: another replica's refresh did not"
                               " finish in time")
    assert 10 <= waited < 11  # the bound, not the holder's 60 s lease
    grant = await store.grant_get("b1", 1)
    assert grant is not None and grant.token_version == 1  # nothing written by the waiter
