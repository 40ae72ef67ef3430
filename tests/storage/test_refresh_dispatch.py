"""Conformance: the refresh call's dispatch marker (migration 0036, seed 8.2) on every
backend. A rotating refresh token is never presented twice: an expired lease whose call
left is never taken over for its version (the grant is marked in doubt instead), one
whose call never left is; only the live lease's owner writes the marker; a late answer
activates by its lease token and heals an in-doubt grant, unless a newer version or
another state came first."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.core.grant_reasons import grant_reason
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.core.work import Fence
from storage.grants import GrantState
from storage.port import SqlTx
from storage.refresh_leases import (
    GrantUnusable,
    LeaseWon,
    MarkerRefused,
    refresh_lease_acquire,
)
from storage.work_store import WorkStore
from tests.support.work import T0, claim, enqueue

S = 1_000_000
TTL = 30 * S
KEY = TokenKey("k1", bytes(range(32)))
BUNDLE = TokenBundle(access_token=SecretText("at-SECRET"), refresh_token=SecretText("rt-SECRET"),
                     expires_at_us=0)


async def _grant(store: WorkStore) -> Fence:
    """The grant, and the live claim (an hour's lease) whose handler refreshes it."""
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 1)),
                              expires_at_us=0, now_us=T0)
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, now=T0, ttl=3600 * S)).claimed
    assert item.fence is not None
    return item.fence


async def _acquire(store: WorkStore, token: str, now: int, *, seen: int = 1,
                   spends: bool = True) -> object:
    async def body(tx: SqlTx) -> object:
        return await refresh_lease_acquire(
            tx, binding_id="b1", generation=1, seen_version=seen, lease_token=token,
            work_id=f"W-{token}", epoch=1, ttl_us=TTL, now_us=now, spends_credential=spends)

    return await store.db.transact(body, name="test.lease")


async def _dispatch(store: WorkStore, token: str, now: int, fence: Fence) -> bool:
    return await store.refresh_dispatch(fence=fence, binding_id="b1", generation=1,
                                        lease_token=token, now=lambda: now) is None


async def _activate(store: WorkStore, token: str, now: int, from_version: int = 1) -> bool:
    return await store.refresh_activate(
        binding_id="b1", generation=1, lease_token=token, from_version=from_version,
        sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, from_version + 1)), expires_at_us=0,
        now_us=now)


async def _state(store: WorkStore) -> tuple[GrantState, int, str | None]:
    grant = await store.grant_get("b1", 1)
    assert grant is not None
    return grant.state, grant.token_version, grant.reason.code if grant.reason else None


async def _old_build_lease(store: WorkStore) -> None:
    """The previous build's acquisition: it names neither marker column."""
    await store.db.transact(lambda tx: tx.execute(
        "UPDATE refresh_leases SET lease_token = 'OLD', owner_work_id = 'W', owner_epoch = 1,"
        " until_us = ?, from_version = 1, started_at_us = ? WHERE binding_id = 'b1'",
        (T0 + TTL, T0)), name="test.old_build")


async def _meanwhile(store: WorkStore, meanwhile: str, now: int) -> None:
    """What happened to the grant at version 1 while its refresh was in doubt (the
    ``meanwhile`` rows here and in test_refresh_unsent.py)."""
    if meanwhile == "reauthorized":
        assert await store.grant_replace(
            binding_id="b1", generation=1, expected_version=1,
            sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 2)), expires_at_us=0,
            now_us=now, refreshed=False)
    elif meanwhile == "revoked":
        assert await store.grant_mark("b1", 1, 1, GrantState.REVOKED, now)
    else:
        assert await store.grant_mark("b1", 1, 1, GrantState.NEEDS_REAUTHORIZATION, now,
                                      grant_reason("invalid_grant"))


async def test_only_the_live_lease_owner_writes_the_marker_once(store: WorkStore) -> None:
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    assert not await _dispatch(store, "other", T0 + 1, fence)  # not our lease
    assert not await _dispatch(store, "A", T0 + TTL + 1, fence)  # our lease is over
    assert await _dispatch(store, "A", T0 + 1, fence)
    assert not await _dispatch(store, "A", T0 + 2, fence)  # once


async def test_an_expired_lease_whose_call_left_puts_the_grant_in_doubt_never_refreshes(
        store: WorkStore) -> None:
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    assert await _dispatch(store, "A", T0 + 1, fence)
    assert await _acquire(store, "B", T0 + TTL + 1) == GrantUnusable("refresh_in_doubt")
    assert await _state(store) == (GrantState.NEEDS_REAUTHORIZATION, 1, "refresh_in_doubt")
    # Pinned: nobody takes the lease, nobody refreshes, however often they ask.
    assert await _acquire(store, "C", T0 + 2 * TTL) == GrantUnusable("refresh_in_doubt")
    # The unfinished owner's late answer heals it: valid at the next version.
    assert await _activate(store, "A", T0 + 3 * TTL)
    assert await _state(store) == (GrantState.VALID, 2, None)
    assert await store.refresh_count("b1", 1) == 1
    # The lease is free again, and the next refresh starts from version 2.
    won = await _acquire(store, "D", T0 + 3 * TTL + 1, seen=2)
    assert isinstance(won, LeaseWon) and won.from_version == 2


async def test_an_expired_lease_whose_call_never_left_is_taken_over(store: WorkStore) -> None:
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    won = await _acquire(store, "B", T0 + TTL + 1)
    assert isinstance(won, LeaseWon) and won.from_version == 1
    assert await _state(store) == (GrantState.VALID, 1, None)
    # The owner it was taken from can neither mark its call nor activate.
    assert not await _dispatch(store, "A", T0 + TTL + 2, fence)
    assert not await _activate(store, "A", T0 + TTL + 2)
    assert await _dispatch(store, "B", T0 + TTL + 2, fence)


async def test_a_mint_whose_call_left_is_simply_done_again(store: WorkStore) -> None:
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0, spends=False), LeaseWon)
    assert await _dispatch(store, "A", T0 + 1, fence)
    assert isinstance(await _acquire(store, "B", T0 + TTL + 1, spends=False), LeaseWon)
    assert await _state(store) == (GrantState.VALID, 1, None)
    assert not await _activate(store, "A", T0 + TTL + 2)  # taken over: too late


async def test_a_lease_from_a_build_without_the_marker_counts_as_dispatched(
        store: WorkStore) -> None:
    await _grant(store)
    await _old_build_lease(store)
    assert await _acquire(store, "B", T0 + TTL + 1) == GrantUnusable("refresh_in_doubt")
    assert await _state(store) == (GrantState.NEEDS_REAUTHORIZATION, 1, "refresh_in_doubt")


@pytest.mark.parametrize(("meanwhile", "expected"), [
    # Re-authorized meanwhile (a new version): the late answer is too old to install.
    ("reauthorized", (GrantState.VALID, 2, None)),
    # Revoked (disconnected) meanwhile: it stays revoked.
    ("revoked", (GrantState.REVOKED, 1, None)),
    # Marked for another reason at this version: never made valid by a refresh.
    ("invalid_grant", (GrantState.NEEDS_REAUTHORIZATION, 1, "invalid_grant")),
])
async def test_a_late_answer_heals_only_its_own_in_doubt_version(
        store: WorkStore, meanwhile: str, expected: tuple[GrantState, int, str | None]
        ) -> None:
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    assert await _dispatch(store, "A", T0 + 1, fence)
    assert await _acquire(store, "B", T0 + TTL + 1) == GrantUnusable("refresh_in_doubt")
    await _meanwhile(store, meanwhile, T0 + TTL + 2)
    assert not await _activate(store, "A", T0 + TTL + 3)
    assert await _state(store) == expected
    assert await store.refresh_count("b1", 1) == 0


async def test_the_owner_marks_its_own_unanswered_call_in_doubt(store: WorkStore) -> None:
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    # Not dispatched yet: there is nothing in doubt (the token never left).
    assert not await store.refresh_in_doubt(binding_id="b1", generation=1, lease_token="A",
                                            from_version=1, now_us=T0 + 1)
    assert await _dispatch(store, "A", T0 + 1, fence)
    assert not await store.refresh_in_doubt(binding_id="b1", generation=1,
                                            lease_token="other", from_version=1,
                                            now_us=T0 + 2)
    assert await _state(store) == (GrantState.VALID, 1, None)
    assert await store.refresh_in_doubt(binding_id="b1", generation=1, lease_token="A",
                                        from_version=1, now_us=T0 + 2)
    assert await _state(store) == (GrantState.NEEDS_REAUTHORIZATION, 1, "refresh_in_doubt")
    # Still its own: an answer that comes after all heals it.
    assert await _activate(store, "A", T0 + 2 * TTL)
    assert await _state(store) == (GrantState.VALID, 2, None)


async def test_ending_a_lease_unspent_clears_the_marker_for_the_next_owner(
        store: WorkStore) -> None:
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    assert await _dispatch(store, "A", T0 + 1, fence)
    # The endpoint refused the request before using the token (or never connected).
    await store.refresh_fail(binding_id="b1", generation=1, lease_token="A",
                             from_version=1, reauthorize=None, now_us=T0 + 2)
    won = await _acquire(store, "B", T0 + 3)
    assert isinstance(won, LeaseWon) and won.from_version == 1
    assert await _state(store) == (GrantState.VALID, 1, None)


@pytest.mark.parametrize("spends", [True, False], ids=["refresh", "mint"])
async def test_the_marker_judges_the_leases_when_its_transaction_runs(
        store: WorkStore, spends: bool) -> None:
    """The claimant read its clock, then waited (for a connection, or frozen) past its
    WorkItem lease before the marker's transaction ran: the marker is judged at the time
    its statements run, not at the time read before the wait. Found by the simulation
    (seeds 28, 58 and 104 of `make simulate SEEDS=200`: a replica frozen at the marker's
    transaction thawed 37 s later and called the token endpoint on a lease that had
    ended 32 s before)."""
    await _grant(store)
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, owner="A", now=T0, ttl=10 * S)).claimed
    assert item.fence is not None
    assert isinstance(await _acquire(store, "A", T0 + 1, spends=spends), LeaseWon)
    clock = [T0 + 2 * S]  # what the caller's clock read before the wait
    inner = store.db.transact

    async def transact_after_a_wait(body: Any, *, name: str, write: bool = True) -> Any:
        clock[0] = T0 + 12 * S  # the wait: past the 10 s WorkItem lease
        return await inner(body, name=name, write=write)

    store.db.transact = transact_after_a_wait  # type: ignore[method-assign]
    try:
        refused = await store.refresh_dispatch(fence=item.fence, binding_id="b1",
                                               generation=1, lease_token="A",
                                               now=lambda: clock[0])
    finally:
        store.db.transact = inner  # type: ignore[method-assign]
    assert refused is MarkerRefused.CLAIM_LOST


@pytest.mark.parametrize("spends", [True, False], ids=["refresh", "mint"])
@pytest.mark.parametrize("reclaimed", [True, False], ids=["reclaimed", "lease_expired"])
async def test_stale_claimant_reclaimed_before_marker_writes_no_marker(
        store: WorkStore, spends: bool, reclaimed: bool) -> None:
    """A claimant took the refresh lease, then its WorkItem lease ended (and the item was
    reclaimed, or not yet) while the refresh lease lived on: the marker is refused for
    the claim, not the lease, and nothing is written (issue 20 item 1; seed 5.1)."""
    await _grant(store)
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, owner="A", now=T0, ttl=10 * S)).claimed
    assert item.fence is not None
    assert isinstance(await _acquire(store, "A", T0 + 1, spends=spends), LeaseWon)
    if reclaimed:
        (again,) = (await claim(store, owner="B", now=T0 + 12 * S)).claimed
        assert again.work_id == item.work_id
    refused = await store.refresh_dispatch(fence=item.fence, binding_id="b1", generation=1,
                                           lease_token="A", now=lambda: T0 + 13 * S)
    assert refused is MarkerRefused.CLAIM_LOST
    assert refused.value == "claim_lost_before_call"
    # No marker: once the lease expires, the next owner takes it over and refreshes
    # (with a marker, a refresh would be in doubt instead).
    won = await _acquire(store, "C", T0 + TTL + 2)
    assert isinstance(won, LeaseWon) and won.from_version == 1
    assert await _state(store) == (GrantState.VALID, 1, None)
