"""Conformance: an owner that wrote its dispatch marker and never sent (seed 8.2) ends its
refresh lease unspent and undoes a doubt a successor judged from that marker, on every
backend (``RefreshLeases.refresh_unsent``). The refresh token was never presented, so the
grant is valid again at the *same* version and the next owner refreshes normally; every
other grant (another version, revoked, in doubt or refused for another reason) and every
other lease (not this owner's, or never marked) is left as it is."""

from __future__ import annotations

import pytest

from daemon.core.token_bundle import BundleContext, seal
from daemon.core.work import Fence
from storage.grants import GrantState
from storage.refresh_leases import (
    GrantUnusable,
    LeaseWon,
    MarkerRefused,
)
from storage.work_store import WorkStore
from tests.storage.test_refresh_dispatch import (
    BUNDLE,
    KEY,
    TTL,
    S,
    _acquire,
    _grant,
    _meanwhile,
    _old_build_lease,
    _state,
)
from tests.support.work import T0, claim, enqueue


async def _dispatch(store: WorkStore, token: str, now: int, fence: Fence
                    ) -> MarkerRefused | None:
    return await store.refresh_dispatch(fence=fence, binding_id="b1", generation=1,
                                        lease_token=token, now=lambda: now)


async def _unsent(store: WorkStore, token: str, now: int) -> bool:
    return await store.refresh_unsent(binding_id="b1", generation=1, lease_token=token,
                                      from_version=1, now_us=now)


async def _in_doubt_behind_a_marker(store: WorkStore) -> Fence:
    """Owner A wrote its marker; a successor found the lease expired with it."""
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    assert await _dispatch(store, "A", T0 + 1, fence) is None
    assert await _acquire(store, "B", T0 + TTL + 1) == GrantUnusable("refresh_in_doubt")
    assert await _state(store) == (GrantState.NEEDS_REAUTHORIZATION, 1, "refresh_in_doubt")
    return fence


async def test_an_owner_that_never_sent_heals_the_doubt_its_marker_caused(
        store: WorkStore) -> None:
    await _in_doubt_behind_a_marker(store)
    assert await _unsent(store, "A", T0 + TTL + 2)
    # Valid again at the same version: the refresh token was never presented.
    assert await _state(store) == (GrantState.VALID, 1, None)
    assert not await store.refresh_in_flight("b1", 1, T0 + TTL + 3)
    won = await _acquire(store, "C", T0 + TTL + 3)
    assert isinstance(won, LeaseWon) and won.from_version == 1
    assert await store.refresh_count("b1", 1) == 0


async def test_the_marker_refused_after_it_was_committed_heals_too(store: WorkStore) -> None:
    """The torture run's log: the owner's marker was committed, a successor judged the
    doubt, and the owner, on waking, was refused the marker for its lost claim
    (``claim_lost_before_call``) and sent nothing. Its unspent end undoes the doubt."""
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 1)),
                              expires_at_us=0, now_us=T0)
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, owner="A", now=T0, ttl=10 * S)).claimed
    assert item.fence is not None
    assert isinstance(await _acquire(store, "A", T0 + 1), LeaseWon)
    assert await _dispatch(store, "A", T0 + 2, item.fence) is None
    assert await _acquire(store, "B", T0 + TTL + 2) == GrantUnusable("refresh_in_doubt")
    assert await _dispatch(store, "A", T0 + TTL + 3, item.fence) is MarkerRefused.CLAIM_LOST
    assert await _unsent(store, "A", T0 + TTL + 3)
    assert await _state(store) == (GrantState.VALID, 1, None)
    assert isinstance(await _acquire(store, "C", T0 + TTL + 4), LeaseWon)


async def test_without_a_doubt_it_only_ends_the_lease(store: WorkStore) -> None:
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    assert await _dispatch(store, "A", T0 + 1, fence) is None
    assert not await _unsent(store, "A", T0 + 2)
    assert await _state(store) == (GrantState.VALID, 1, None)
    # Ended unspent, the marker cleared: the next owner need not wait for the lease.
    won = await _acquire(store, "B", T0 + 3)
    assert isinstance(won, LeaseWon) and won.from_version == 1


async def test_a_lease_that_is_not_the_owners_heals_nothing(store: WorkStore) -> None:
    await _in_doubt_behind_a_marker(store)
    assert not await _unsent(store, "other", T0 + TTL + 2)
    assert await _state(store) == (GrantState.NEEDS_REAUTHORIZATION, 1, "refresh_in_doubt")
    # Still pinned to A: nobody refreshes; A's late answer (if it sent) could still heal.
    assert await _acquire(store, "C", T0 + TTL + 3) == GrantUnusable("refresh_in_doubt")


async def test_a_doubt_not_behind_this_owners_marker_is_left(store: WorkStore) -> None:
    """A lease of a build that writes no marker counts as dispatched; the owner of the
    lease row is not this one's, whatever its token says: nothing to undo."""
    await _grant(store)
    await _old_build_lease(store)
    assert await _acquire(store, "B", T0 + TTL + 1) == GrantUnusable("refresh_in_doubt")
    assert not await _unsent(store, "OLD", T0 + TTL + 2)
    assert await _state(store) == (GrantState.NEEDS_REAUTHORIZATION, 1, "refresh_in_doubt")


@pytest.mark.parametrize(("meanwhile", "expected"), [
    # Re-authorized meanwhile (a new version): that version is not touched.
    ("reauthorized", (GrantState.VALID, 2, None)),
    # Revoked (disconnected) meanwhile: it stays revoked.
    ("revoked", (GrantState.REVOKED, 1, None)),
    # Marked for another reason at this version: never made valid here.
    ("invalid_grant", (GrantState.NEEDS_REAUTHORIZATION, 1, "invalid_grant")),
])
async def test_only_the_in_doubt_version_is_healed(
        store: WorkStore, meanwhile: str, expected: tuple[GrantState, int, str | None]
        ) -> None:
    await _in_doubt_behind_a_marker(store)
    await _meanwhile(store, meanwhile, T0 + TTL + 2)
    assert not await _unsent(store, "A", T0 + TTL + 3)
    assert await _state(store) == expected


async def test_a_lease_never_marked_is_ended_and_heals_nothing(store: WorkStore) -> None:
    """The marker refused with no marker ever written (the designed case of
    ``claim_lost_before_call``): the lease ends unspent; the grant was never in doubt."""
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    assert not await _unsent(store, "A", T0 + 1)
    assert await _state(store) == (GrantState.VALID, 1, None)
    assert await _dispatch(store, "A", T0 + 2, fence) is MarkerRefused.LEASE_LOST
    assert isinstance(await _acquire(store, "B", T0 + 3), LeaseWon)
