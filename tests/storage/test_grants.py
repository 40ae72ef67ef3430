"""Conformance: AuthorizationGrant rows on every backend: sealed only, one next version."""

from __future__ import annotations

import pytest

from daemon.core.connect_flows import Flow
from daemon.core.grant_reasons import grant_reason
from daemon.core.principals import BindingIdentity, PrincipalKind, connect
from daemon.core.token_bundle import (
    BundleContext,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    seal,
)
from storage.grants import GrantState
from storage.port import SqlTx, WorkConflict
from storage.principals import Actor
from storage.refresh_leases import refresh_lease_acquire
from storage.work_store import WorkStore
from tests.support.work import T0

KEY = TokenKey("k1", bytes(range(32)))
BUNDLE = TokenBundle(access_token=SecretText("at-SECRET"), refresh_token=SecretText("rt-SECRET"),
                     expires_at_us=T0 + 3600_000_000)



async def test_install_then_read_back_sealed(store: WorkStore) -> None:
    sealed = seal(BUNDLE, KEY, BundleContext("b1", 2, 1))
    got = await store.grant_install(binding_id="b1", generation=2, sealed=sealed,
                                    expires_at_us=BUNDLE.expires_at_us, now_us=T0)
    assert (got.token_version, got.state, got.sealed) == (1, GrantState.VALID, sealed)
    assert open_bundle(got.sealed, {"k1": KEY}, BundleContext("b1", 2, 1)) == BUNDLE
    assert await store.grant_get("b1", 2) == got
    assert await store.grant_get("b1", 3) is None
    with pytest.raises(WorkConflict, match="already has a grant"):
        await store.grant_install(binding_id="b1", generation=2, sealed=sealed,
                                  expires_at_us=0, now_us=T0)


async def test_one_writer_installs_each_next_version(store: WorkStore) -> None:
    await store.grant_install(binding_id="b1", generation=2,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 1)),
                              expires_at_us=0, now_us=T0)
    v2 = seal(BUNDLE, KEY, BundleContext("b1", 2, 2))
    assert await store.grant_replace(binding_id="b1", generation=2, expected_version=1,
                                     sealed=v2, expires_at_us=T0 + 1, now_us=T0 + 5,
                                     refreshed=True)
    # A stale writer that also read version 1 cannot overwrite version 2.
    stale = seal(BUNDLE, KEY, BundleContext("b1", 2, 2))
    assert not await store.grant_replace(binding_id="b1", generation=2, expected_version=1,
                                         sealed=stale, expires_at_us=0, now_us=T0 + 6,
                                         refreshed=True)
    got = await store.grant_get("b1", 2)
    assert got is not None
    assert (got.token_version, got.sealed, got.last_refresh_at_us) == (2, v2, T0 + 5)
    # A rewrap is not a refresh: the last refresh time stays.
    assert await store.grant_replace(binding_id="b1", generation=2, expected_version=2,
                                     sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 3)),
                                     expires_at_us=T0 + 1, now_us=T0 + 9, refreshed=False)
    got = await store.grant_get("b1", 2)
    assert got is not None and (got.token_version, got.last_refresh_at_us) == (3, T0 + 5)


async def test_state_is_marked_only_at_the_version_seen(store: WorkStore) -> None:
    await store.grant_install(binding_id="b1", generation=2,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 1)),
                              expires_at_us=0, now_us=T0)
    assert not await store.grant_mark("b1", 2, 7, GrantState.NEEDS_REAUTHORIZATION, T0)
    assert await store.grant_mark("b1", 2, 1, GrantState.NEEDS_REAUTHORIZATION, T0)
    got = await store.grant_get("b1", 2)
    assert got is not None and got.state is GrantState.NEEDS_REAUTHORIZATION
    assert [g.binding_id for g in await store.grant_list()] == ["b1"]


async def test_a_reason_is_written_with_the_state_and_cleared_by_a_new_version(
        store: WorkStore) -> None:
    await store.grant_install(binding_id="b1", generation=2,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 1)),
                              expires_at_us=0, now_us=T0)
    fresh = await store.grant_get("b1", 2)
    assert fresh is not None and fresh.reason is None
    why = grant_reason("invalid_grant")
    # At a version nobody saw: nothing written, the reason neither.
    assert not await store.grant_mark("b1", 2, 7, GrantState.NEEDS_REAUTHORIZATION, T0, why)
    got = await store.grant_get("b1", 2)
    assert got is not None and (got.state, got.reason) == (GrantState.VALID, None)
    assert await store.grant_mark("b1", 2, 1, GrantState.NEEDS_REAUTHORIZATION, T0, why)
    got = await store.grant_get("b1", 2)
    assert got is not None and (got.state, got.reason) == (
        GrantState.NEEDS_REAUTHORIZATION, why)
    # A new token version (the Runtime's new grant of this generation) clears it.
    assert await store.grant_replace(binding_id="b1", generation=2, expected_version=1,
                                     sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 2)),
                                     expires_at_us=0, now_us=T0 + 1, refreshed=False)
    got = await store.grant_get("b1", 2)
    assert got is not None and (got.state, got.reason, got.token_version) == (
        GrantState.VALID, None, 2)


async def test_a_rewrap_keeps_the_state_and_reason_a_new_grant_clears(
        store: WorkStore) -> None:
    """Re-encrypting the same credential cures nothing: a grant in doubt (its refresh
    token possibly spent) stays in doubt through a key rotation."""
    await store.grant_install(binding_id="b1", generation=2,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 1)),
                              expires_at_us=0, now_us=T0)
    why = grant_reason("refresh_in_doubt")
    assert await store.grant_mark("b1", 2, 1, GrantState.NEEDS_REAUTHORIZATION, T0, why)
    assert await store.grant_replace(binding_id="b1", generation=2, expected_version=1,
                                     sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 2)),
                                     expires_at_us=0, now_us=T0 + 1, refreshed=False,
                                     keep_state=True)
    got = await store.grant_get("b1", 2)
    assert got is not None and (got.state, got.reason, got.token_version) == (
        GrantState.NEEDS_REAUTHORIZATION, why, 2)
    # At a version nobody saw: nothing written.
    assert not await store.grant_replace(binding_id="b1", generation=2, expected_version=1,
                                         sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 2)),
                                         expires_at_us=0, now_us=T0 + 2, refreshed=False,
                                         keep_state=True)
    assert await store.grant_replace(binding_id="b1", generation=2, expected_version=2,
                                     sealed=seal(BUNDLE, KEY, BundleContext("b1", 2, 3)),
                                     expires_at_us=0, now_us=T0 + 3, refreshed=False)
    got = await store.grant_get("b1", 2)
    assert got is not None and (got.state, got.reason, got.token_version) == (
        GrantState.VALID, None, 3)


async def test_a_refused_refresh_writes_its_reason_only_under_the_live_lease(
        store: WorkStore) -> None:
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 1)),
                              expires_at_us=0, now_us=T0)

    async def lease(tx: SqlTx) -> object:
        return await refresh_lease_acquire(tx, binding_id="b1", generation=1, seen_version=1,
                                           lease_token="L", work_id="W", epoch=1,
                                           ttl_us=60_000_000, now_us=T0)

    await store.db.transact(lease, name="refresh.lease")
    why = grant_reason("refresh_token_possibly_spent")
    # Not our lease: nothing marked.
    await store.refresh_fail(binding_id="b1", generation=1, lease_token="other",
                             from_version=1, reauthorize=why, now_us=T0 + 1)
    got = await store.grant_get("b1", 1)
    assert got is not None and (got.state, got.reason) == (GrantState.VALID, None)
    await store.refresh_fail(binding_id="b1", generation=1, lease_token="L",
                             from_version=1, reauthorize=why, now_us=T0 + 2)
    got = await store.grant_get("b1", 1)
    assert got is not None and (got.state, got.reason) == (
        GrantState.NEEDS_REAUTHORIZATION, why)


async def test_the_reauthorization_counts_are_of_current_generations_by_reason(
        store: WorkStore) -> None:
    who = Actor("setup", "admin", "test")
    for binding_id in ("b1", "b2", "b3"):
        await store.binding_connect(connect(
            binding_id=binding_id, kind=PrincipalKind.SHARED, org_id="o",
            app_installation_id="i", provider="p",
            identity=BindingIdentity(issuer="x", remote_account_id="a", remote_subject="s")),
            who, T0)
        await store.grant_install(binding_id=binding_id, generation=1,
                                  sealed=seal(BUNDLE, KEY, BundleContext(binding_id, 1, 1)),
                                  expires_at_us=0, now_us=T0)
    assert await store.grant_reauthorization_counts() == {}
    spent = grant_reason("refresh_token_possibly_spent")
    assert await store.grant_mark("b1", 1, 1, GrantState.NEEDS_REAUTHORIZATION, T0, spent)
    assert await store.grant_mark("b2", 1, 1, GrantState.NEEDS_REAUTHORIZATION, T0, spent)
    assert await store.grant_mark("b3", 1, 1, GrantState.NEEDS_REAUTHORIZATION, T0)
    assert await store.grant_reauthorization_counts() == {
        "refresh_token_possibly_spent": 2, "unrecorded": 1}
    # b2 moves on (an operator's reinstall): its old generation's grant no longer counts.
    await store.binding_operator_flow("b2", Flow.REINSTALL, who, expected_generation=1,
                                      now_us=T0 + 1, changes={})
    assert await store.grant_reauthorization_counts() == {
        "refresh_token_possibly_spent": 1, "unrecorded": 1}
