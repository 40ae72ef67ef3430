"""Conformance: a token refresh never presents the refresh token of a binding generation
that was superseded after its lease was taken (seed 8.1, 8.2, 13: "reconnect cannot
retarget queued work"; the superseded generation's grant is never used again). The
refresh lease is taken on a valid grant of the claim's pinned generation; a reconnect,
a reinstall or a disconnect may commit before the dispatch marker (the window the
simulation's reconnect operator places its moves in, ``refresh.dispatch``). The marker's
transaction judges the binding as it is then: moved past the generation, disconnected,
or the grant revoked, it writes nothing and the call never leaves. Every backend."""

from __future__ import annotations

import pytest

from daemon.core.principals import (
    BindingEvent,
    BindingIdentity,
    PrincipalKind,
    connect,
)
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.core.work import Fence
from storage.grants import GrantState
from storage.port import SqlTx
from storage.principals import Actor
from storage.refresh_leases import LeaseWon, MarkerRefused, refresh_lease_acquire
from storage.work_store import WorkStore
from tests.support.work import T0, claim, enqueue

S = 1_000_000
KEY = TokenKey("k1", bytes(range(32)))
BUNDLE = TokenBundle(access_token=SecretText("at-SECRET"), refresh_token=SecretText("rt-SECRET"),
                     expires_at_us=0)
WHO = Actor("alice", "admin", "test")


async def _leased(store: WorkStore) -> Fence:
    await store.binding_connect(connect(
        binding_id="b1", kind=PrincipalKind.SHARED, org_id="o", app_installation_id="i",
        provider="p", identity=BindingIdentity(issuer="x", remote_account_id="a",
                                               remote_subject="s")), WHO, T0)
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 1)),
                              expires_at_us=0, now_us=T0)
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, now=T0, ttl=3600 * S)).claimed
    fence = item.fence
    assert fence is not None

    async def body(tx: SqlTx) -> object:
        return await refresh_lease_acquire(
            tx, binding_id="b1", generation=1, seen_version=1, lease_token="A",
            work_id=fence.work_id, epoch=fence.ownership_epoch, ttl_us=30 * S, now_us=T0)

    assert isinstance(await store.db.transact(body, name="test.lease"), LeaseWon)
    return fence


async def _move(store: WorkStore, how: str) -> None:
    if how == "revoked":
        assert await store.grant_mark("b1", 1, 1, GrantState.REVOKED, T0 + 1)
        return
    await store.binding_transition("b1", BindingEvent.DISCONNECT, WHO,
                                   expected_generation=1, now_us=T0 + 1)
    if how == "reconnected":
        await store.binding_transition("b1", BindingEvent.RECONNECT, WHO,
                                       expected_generation=1, now_us=T0 + 1)


@pytest.mark.parametrize(("how", "why"), [
    ("disconnected", MarkerRefused.BINDING_DISCONNECTED),
    ("reconnected", MarkerRefused.BINDING_MOVED),
    ("revoked", MarkerRefused.GRANT_REVOKED),
])
async def test_the_marker_refuses_a_generation_superseded_after_the_lease(
        store: WorkStore, how: str, why: MarkerRefused) -> None:
    fence = await _leased(store)
    await _move(store, how)
    refused = await store.refresh_dispatch(fence=fence, binding_id="b1", generation=1,
                                           lease_token="A", now=lambda: T0 + 2)
    assert refused is why


async def test_the_marker_of_the_current_generation_is_written(store: WorkStore) -> None:
    fence = await _leased(store)
    assert await store.refresh_dispatch(fence=fence, binding_id="b1", generation=1,
                                        lease_token="A", now=lambda: T0 + 2) is None
