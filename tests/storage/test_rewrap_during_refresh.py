"""Conformance: a key rotation's rewrap never takes the token version a refresh in flight
will activate (found by the simulation's key-rotation operator, seed 7: `keys rotate`
rewrapped a grant while a replica's refresh of it was in flight; the refresh's
activation, a compare-and-swap on the version it refreshed from, then failed, its new
tokens were dropped, and the grant kept the refresh token the provider had just rotated
away: the next refresh presented it again, `invalid_grant`, and the grant needed
re-authorization). A grant whose refresh lease is live, or whose call left and was never
activated, is left to the refresh (counted as refreshing; a later rotation rewraps it).
Every backend."""

from __future__ import annotations

import pytest

from daemon.core.token_bundle import (
    BundleContext,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    seal,
)
from daemon.core.work import Fence
from daemon.services.key_rotation import rotate_keys
from storage.port import SqlTx
from storage.refresh_leases import LeaseWon, refresh_lease_acquire
from storage.work_store import WorkStore
from tests.support.work import T0, claim, enqueue

S = 1_000_000
TTL = 30 * S
OLD = TokenKey("k1", bytes(range(32)))
NEW = TokenKey("k2", bytes(range(100, 132)))
KEYS = {OLD.key_id: OLD, NEW.key_id: NEW}
FIRST = TokenBundle(access_token=SecretText("at1-SECRET"),
                    refresh_token=SecretText("rt1-SECRET"), expires_at_us=0)
REFRESHED = TokenBundle(access_token=SecretText("at2-SECRET"),
                        refresh_token=SecretText("rt2-SECRET"), expires_at_us=0)


async def _grant_and_lease(store: WorkStore, *, dispatched: bool) -> None:
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(FIRST, OLD, BundleContext("b1", 1, 1)),
                              expires_at_us=0, now_us=T0)
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, now=T0, ttl=3600 * S)).claimed
    fence: Fence | None = item.fence
    assert fence is not None

    async def body(tx: SqlTx) -> object:
        return await refresh_lease_acquire(
            tx, binding_id="b1", generation=1, seen_version=1, lease_token="A",
            work_id=fence.work_id, epoch=fence.ownership_epoch, ttl_us=TTL, now_us=T0,
            spends_credential=True)

    assert isinstance(await store.db.transact(body, name="test.lease"), LeaseWon)
    if dispatched:
        assert await store.refresh_dispatch(fence=fence, binding_id="b1", generation=1,
                                            lease_token="A", now=lambda: T0 + 1) is None


async def _activate(store: WorkStore, now: int) -> bool:
    """The refresh's answer (the provider rotated rt1 to rt2), sealed under the key the
    refreshing replica has active (the old one: it has not been restarted yet)."""
    return await store.refresh_activate(
        binding_id="b1", generation=1, lease_token="A", from_version=1,
        sealed=seal(REFRESHED, OLD, BundleContext("b1", 1, 2)), expires_at_us=0,
        now_us=now)


async def _bundle(store: WorkStore) -> tuple[str, int, TokenBundle]:
    grant = await store.grant_get("b1", 1)
    assert grant is not None
    return (grant.sealed.key_id, grant.token_version,
            open_bundle(grant.sealed, KEYS, BundleContext("b1", 1, grant.token_version)))


@pytest.mark.parametrize("dispatched", [False, True], ids=["lease_live", "call_left"])
async def test_a_rotation_leaves_a_grant_being_refreshed_to_its_refresh(
        store: WorkStore, dispatched: bool) -> None:
    await _grant_and_lease(store, dispatched=dispatched)
    report = await rotate_keys(store, KEYS, NEW.key_id, actor="root", reason="rotation",
                               now_us=T0 + 2)
    assert (report.rewrapped, report.refreshing) == (0, 1)
    assert await _activate(store, T0 + 3), "the refresh's answer was not activated"
    assert await _bundle(store) == ("k1", 2, REFRESHED)
    # The refresh is done: the next rotation rewraps the refreshed tokens.
    again = await rotate_keys(store, KEYS, NEW.key_id, actor="root", reason="again",
                              now_us=T0 + 4)
    assert (again.rewrapped, again.refreshing) == (1, 0)
    assert await _bundle(store) == ("k2", 3, REFRESHED)


async def test_a_lease_that_ended_before_its_call_does_not_hold_a_rotation_back(
        store: WorkStore) -> None:
    """Its owner can no longer call (the marker needs a live lease), so nothing is in
    flight: the rewrap goes on, and the owner's late activation is refused."""
    await _grant_and_lease(store, dispatched=False)
    report = await rotate_keys(store, KEYS, NEW.key_id, actor="root", reason="rotation",
                               now_us=T0 + TTL + 1)
    assert (report.rewrapped, report.refreshing) == (1, 0)
    assert not await _activate(store, T0 + TTL + 2)
    assert await _bundle(store) == ("k2", 2, FIRST)
