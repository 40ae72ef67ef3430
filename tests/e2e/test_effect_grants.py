"""Effects take their token from the binding generation's AuthorizationGrant (issue 9 item 2).

Real servers on loopback: the HubSpot simulator accepts exactly the access tokens the
OAuth simulator (rotating refresh tokens) has issued. A 401 on an effect is not a
terminal NO_EFFECT: it earns one refresh through the single-winner token owner, and the
effect is retried with the new token version. Only a definitive authorization failure
settles it, with that reason: ``invalid_grant`` marks the grant "needs re-authorization"
and the work fails closed; a second 401 after the refresh settles as a rejection.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.services.clock import WallClock
from sandbox.oauth_sim import OAuthSimulator, running_oauth
from storage.grants import GrantState
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.e2e.test_effect_pins import _signed_in
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import Slice, SliceGrant, running_slice
from tests.ui.support import _OPERATORS

pytestmark = pytest.mark.slow

KEY = TokenKey("k1", bytes(range(32)))
CLIENT_SECRET = "client-SECRET-grant"
STALE = "access-SECRET-stale"  # never accepted by the provider: the first call is a 401
REFRESH = "refresh-SECRET-0"


@pytest.fixture
async def oauth() -> AsyncIterator[tuple[OAuthSimulator, str]]:
    async with running_oauth(CLIENT_SECRET) as running:
        yield running


async def _grant(store: WorkStore, access: str, *, seed: OAuthSimulator | None) -> None:
    now = WallClock().now_us()
    if seed is not None:
        seed.seed(REFRESH)
    bundle = TokenBundle(access_token=SecretText(access), refresh_token=SecretText(REFRESH),
                         expires_at_us=now + 3_600_000_000)
    await store.grant_install(binding_id="hubspot-main", generation=1,
                              sealed=seal(bundle, KEY, BundleContext("hubspot-main", 1, 1)),
                              expires_at_us=bundle.expires_at_us, now_us=now)


def _setup(tmp_path: Path, sim: OAuthSimulator, url: str) -> SliceGrant:
    (tmp_path / "k1.key").write_text(KEY.material.hex())
    return SliceGrant(token_url=url, client_secret=CLIENT_SECRET, key_dir=str(tmp_path),
                      tokens=sim.access_tokens)


async def _settled(sl: Slice, store: WorkStore, intent_id: str) -> tuple[str, str, str]:
    await sl.wait_intent("lead-1", intent_id, "COMMITTED")
    (item,) = await store.work_list(WorkQuery(family="external_effect"))
    return item.state.value, str(item.terminal_outcome), item.failure_class or ""


async def test_a_401_refreshes_once_and_the_effect_is_retried_with_the_new_version(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    await _grant(store, STALE, seed=sim)
    async with running_slice(store, database.url, grant=_setup(tmp_path, sim, url),
                             operators=_OPERATORS) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        assert await _settled(sl, store, intent_id) == ("succeeded", "succeeded", "")
        # The console shows the binding's generation, grant state and token version; no
        # token, refresh token or client secret appears in what it serves.
        client = await _signed_in(sl, "viv")
        try:
            doc = (await client.get("/admin/api/bindings")).json()
            page = (await client.get("/admin/bindings")).text
        finally:
            await client.aclose()
        (b,) = doc["items"]
        assert b["durable"] == {"generation": 1, "state": "connected", "kind": "shared",
                                "user_id": None, "remote_account_id": "portal-1",
                                "installation_id": None}
        assert b["drift"] == []
        assert (b["auth"], b["grant"]["state"], b["grant"]["token_version"]) == (
            "grant", "valid", 2)
        served = json.dumps(doc) + page
        for secret in (STALE, REFRESH, CLIENT_SECRET, *sim.access_tokens,
                       *sim.valid_refresh):
            assert secret not in served
        assert sl.sim.patches_applied("101") == 1
        # One refresh reached the token endpoint; two PATCHes: the 401, then the retry.
        assert [e["answer"] for e in sim.journal] == ["ok"]
        assert [r.status for r in sl.patches("101")] == [401, 200]
        grant = await store.grant_get("hubspot-main", 1)
        assert grant is not None and grant.token_version == 2
        assert grant.state is GrantState.VALID


async def test_invalid_grant_fails_the_work_closed_with_needs_reauthorization(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    await _grant(store, STALE, seed=None)  # the refresh token is not valid any more
    async with running_slice(store, database.url, grant=_setup(tmp_path, sim, url)) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        assert await _settled(sl, store, intent_id) == (
            "succeeded", "no_effect", "needs_reauthorization")
        assert [e["answer"] for e in sim.journal] == ["invalid_grant"]  # once, no loop
        assert [r.status for r in sl.patches("101")] == [401]
        grant = await store.grant_get("hubspot-main", 1)
        assert grant is not None and grant.state is GrantState.NEEDS_REAUTHORIZATION
        assert grant.reason is not None and grant.reason.code == "invalid_grant"
        assert sl.replica is not None
        metrics = sl.replica.metrics_text().decode()
        assert ('integrationd_effect_credential_failures_total{reason="needs_reauthorization"}'
                ' 1.0') in metrics


async def test_a_second_401_after_the_refresh_is_a_definitive_rejection(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    await _grant(store, STALE, seed=sim)
    grant = _setup(tmp_path, sim, url)
    # The provider accepts none of the tokens the OAuth server issues.
    refused = SliceGrant(grant.token_url, grant.client_secret, grant.key_dir, set())
    async with running_slice(store, database.url, grant=refused) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        assert await _settled(sl, store, intent_id) == ("succeeded", "no_effect", "http_401")
        assert [e["answer"] for e in sim.journal] == ["ok"]
        assert [r.status for r in sl.patches("101")] == [401, 401]


async def test_a_bundle_that_fails_authentication_is_refused_alerted_and_never_used(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    # Sealed under another key with the same id (a restored backup, a swapped key file).
    now = WallClock().now_us()
    other = TokenKey("k1", bytes(range(100, 132)))
    bundle = TokenBundle(access_token=SecretText(STALE), refresh_token=SecretText(REFRESH),
                         expires_at_us=now + 3_600_000_000)
    await store.grant_install(binding_id="hubspot-main", generation=1,
                              sealed=seal(bundle, other, BundleContext("hubspot-main", 1, 1)),
                              expires_at_us=bundle.expires_at_us, now_us=now)
    sim.access_tokens.add(STALE)  # were it used, the provider would accept it
    async with running_slice(store, database.url, grant=_setup(tmp_path, sim, url)) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        assert await _settled(sl, store, intent_id) == (
            "succeeded", "no_effect", "token_bundle_unauthentic")
        assert sl.patches("101") == [] and sim.journal == []  # never used, never refreshed
        assert sl.replica is not None
        assert ('integrationd_effect_credential_failures_total{reason="token_bundle_unauthentic"}'
                ' 1.0') in sl.replica.metrics_text().decode()
        # Refused by this replica only: the shared grant is not marked (its key file may
        # be the wrong one; a replica with the right key goes on using the grant).
        grant = await store.grant_get("hubspot-main", 1)
        assert grant is not None and (grant.state, grant.reason) == (GrantState.VALID, None)


async def test_a_refresh_in_doubt_defers_the_work_until_the_grant_heals_and_burns_no_attempt(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    """A malformed token answer says nothing of the refresh token the call presented (the
    provider may have rotated it): the grant is in doubt (``refresh_in_doubt``) and
    nobody presents that token again. That is not the effect's failure: nothing was
    sent, so the claim is given back unstarted (``Deferred``, journaled with the reason),
    never charged an attempt, again and again, until the grant heals; then the effect
    completes. (Before deferrals, each was a RetryLater: with ``max_attempts = 2`` two
    bad answers dead-lettered a command that had never been sent. Before the in-doubt
    state, the next claim presented the possibly spent token again.)"""
    sim, url = oauth
    sim.seed(REFRESH)
    now = WallClock().now_us()
    bundle = TokenBundle(access_token=SecretText(STALE), refresh_token=SecretText(REFRESH),
                         expires_at_us=now - 1)  # expired: the first claim must refresh
    await store.grant_install(binding_id="hubspot-main", generation=1,
                              sealed=seal(bundle, KEY, BundleContext("hubspot-main", 1, 1)),
                              expires_at_us=bundle.expires_at_us, now_us=now)
    sim.malformed = True
    async with running_slice(store, database.url, grant=_setup(tmp_path, sim, url),
                             max_attempts=2) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")

        async def deferred_three_times_or_dead() -> bool:
            items = await store.work_list(WorkQuery(family="external_effect"))
            if not items:
                return False
            (item,) = items
            executions = await store.work_executions(item.work_id)
            return item.state.value == "dead" or sum(
                e.outcome == "deferred" for e in executions) >= 3

        await wait_for(deferred_three_times_or_dead, within_s=60)
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        assert item.state.value != "dead", (item.failure_class, item.operator_summary)
        executions = await store.work_executions(item.work_id)
        assert {e.reason for e in executions if e.outcome == "deferred"} == {
            "refresh_in_doubt"}
        assert [e["answer"] for e in sim.journal] == ["malformed"]  # never presented again
        grant = await store.grant_get("hubspot-main", 1)
        assert grant is not None and grant.reason is not None
        assert (grant.state, grant.reason.code) == (GrantState.NEEDS_REAUTHORIZATION,
                                                    "refresh_in_doubt")
        # The binding is re-authorized: a new token version of the generation, as the
        # connect flows install it. The waiting effect completes with it.
        sim.malformed = False
        fresh = TokenBundle(access_token=SecretText("access-SECRET-fresh"),
                            refresh_token=SecretText("refresh-SECRET-fresh"),
                            expires_at_us=WallClock().now_us() + 3_600_000_000)
        sim.access_tokens.add("access-SECRET-fresh")
        assert await store.grant_replace(
            binding_id="hubspot-main", generation=1, expected_version=1,
            sealed=seal(fresh, KEY, BundleContext("hubspot-main", 1, 2)),
            expires_at_us=fresh.expires_at_us, now_us=WallClock().now_us(), refreshed=False)
        assert await _settled(sl, store, intent_id) == ("succeeded", "succeeded", "")
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        assert item.attempt == 1  # only the claim that sent
        assert [r.status for r in sl.patches("101")] == [200]
        assert [e["answer"] for e in sim.journal] == ["malformed"]


async def test_a_revoked_grant_fails_the_work_closed_and_nothing_is_called(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    await _grant(store, STALE, seed=sim)
    sim.access_tokens.add(STALE)  # were it used, the provider would accept it
    assert await store.grant_mark("hubspot-main", 1, 1, GrantState.REVOKED,
                                  WallClock().now_us())
    async with running_slice(store, database.url, grant=_setup(tmp_path, sim, url)) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        assert await _settled(sl, store, intent_id) == ("succeeded", "no_effect", "revoked")
        assert sl.patches("101") == [] and sim.journal == []  # never used, never refreshed
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        assert item.attempt == 1
