"""The torture run's operator re-authorizes a grant in doubt only when the run's own SIGKILL
put it there and the provider saw the refresh token at most once (bench/torture_operator.py)."""

from __future__ import annotations

import pytest
import trio

from bench.torture import TOKEN_KEY, Run, operator, reauthorize_kills
from bench.torture_operator import Doubt, Verdict, verdict
from daemon.core.grant_reasons import grant_reason
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, seal
from daemon.services.principal_bootstrap import bootstrap_facts
from sandbox.oauth_sim import OAuthSimulator, token_digest
from storage.grants import GrantState
from storage.port import SqlTx
from storage.refresh_leases import LeaseWon, refresh_lease_acquire
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.commands import HUBSPOT_MAIN
from tests.support.work import T0, claim, enqueue

KILLED = frozenset({"host:101", "host:202"})


@pytest.mark.parametrize(("doubt", "expected"), [
    # The owner was killed, the call never reached the provider: the kill's doubt.
    (Doubt(owner_replica="host:101", presentations=0, marked=True), Verdict.REAUTHORIZE),
    # The killed owner's call reached the provider once and its answer died with it: the
    # trade of rotating tokens, settled by a re-authorization.
    (Doubt(owner_replica="host:202", presentations=1, marked=True), Verdict.REAUTHORIZE),
    # The owner's epoch not journaled yet (its item not reclaimed): ask again.
    (Doubt(owner_replica=None, presentations=0, marked=True), Verdict.WAIT),
    (Doubt(owner_replica=None, presentations=1, marked=True), Verdict.WAIT),
    # A live owner (never killed) that left its refresh unfinished: not the kill's doing.
    (Doubt(owner_replica="host:303", presentations=0, marked=True), Verdict.LEAVE),
    (Doubt(owner_replica="host:303", presentations=1, marked=True), Verdict.LEAVE),
    # The provider saw the token twice: a double refresh, whoever held the lease.
    (Doubt(owner_replica="host:101", presentations=2, marked=True), Verdict.LEAVE),
    (Doubt(owner_replica="host:101", presentations=5, marked=True), Verdict.LEAVE),
    (Doubt(owner_replica=None, presentations=2, marked=True), Verdict.LEAVE),
    # No dispatch marker: not the trade's doubt (the product refreshes such a lease itself).
    (Doubt(owner_replica="host:101", presentations=0, marked=False), Verdict.LEAVE),
    (Doubt(owner_replica="host:101", presentations=1, marked=False), Verdict.LEAVE),
])
def test_verdict(doubt: Doubt, expected: Verdict) -> None:
    assert verdict(doubt, KILLED) is expected


def test_nobody_killed_means_nothing_is_reauthorized() -> None:
    for presentations in (0, 1):
        doubt = Doubt(owner_replica="host:101", presentations=presentations, marked=True)
        assert verdict(doubt, frozenset()) is Verdict.LEAVE


# ------------------------------------------------------------------ against a database

BINDING = HUBSPOT_MAIN.binding_id
S = 1_000_000


async def _in_doubt(store: WorkStore, oauth: OAuthSimulator, *, killed_owner: bool
                    ) -> tuple[Run, str]:
    """A grant left ``refresh_in_doubt`` the way a kill leaves it: the lease owner's claim
    took the refresh lease and committed the dispatch marker, its replica died (its epoch
    journaled ``lease_lost`` when another replica reclaimed the item), and a successor
    found the expired lease with the marker. Returns the run and the owner's replica id."""
    await store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN), T0)
    refresh = "rt-in-doubt"
    oauth.seed(refresh)
    bundle = TokenBundle(access_token=SecretText("at-1"), refresh_token=SecretText(refresh),
                         expires_at_us=T0)
    await store.grant_install(binding_id=BINDING, generation=1,
                              sealed=seal(bundle, TOKEN_KEY, BundleContext(BINDING, 1, 1)),
                              expires_at_us=T0, now_us=T0)
    owner = "host:4242"
    await enqueue(store, 1, now=T0)
    (item,) = (await claim(store, owner=owner, now=T0, ttl=5 * S)).claimed
    assert item.fence is not None

    async def acquire(tx: SqlTx) -> object:
        return await refresh_lease_acquire(
            tx, binding_id=BINDING, generation=1, seen_version=1, lease_token="L1",
            work_id=item.work_id, epoch=item.ownership_epoch, ttl_us=2 * S, now_us=T0,
            spends_credential=True)

    assert isinstance(await store.db.transact(acquire, name="test.lease"), LeaseWon)
    assert await store.refresh_dispatch(fence=item.fence, binding_id=BINDING, generation=1,
                                        lease_token="L1", now=lambda: T0 + 1) is None
    # The owner died: another replica reclaims its item (journaling the owner's epoch) and
    # finds the refresh lease expired with its marker.
    assert (await claim(store, owner="host:1", now=T0 + 10 * S)).claimed
    assert await store.grant_mark(BINDING, 1, 1, GrantState.NEEDS_REAUTHORIZATION, T0 + 10 * S,
                                  grant_reason("refresh_in_doubt"))
    run = Run(backend="sqlite", replicas=[], urls=[], cluster=None, log=lambda line: None)
    if killed_owner:
        run.killed.add(owner)
    return run, owner


async def _grant(store: WorkStore) -> tuple[GrantState, int]:
    grant = await store.grant_get(BINDING, 1)
    assert grant is not None
    return grant.state, grant.token_version


def _present(oauth: OAuthSimulator, times: int) -> None:
    """The in-doubt refresh token in the OAuth simulator's journal, ``times`` calls."""
    for _ in range(times):
        oauth.journal.append({"refresh_token": token_digest("rt-in-doubt"), "answer": "ok"})


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("presentations", [0, 1])
async def test_the_operator_reauthorizes_a_doubt_the_kill_made(
        store: WorkStore, presentations: int) -> None:
    oauth = OAuthSimulator(client_secret="s", lifetime_s=70)
    run, _ = await _in_doubt(store, oauth, killed_owner=True)
    _present(oauth, presentations)
    await reauthorize_kills(run, store, oauth)
    assert await _grant(store) == (GrantState.VALID, 2)
    assert run.counts["grants_reauthorized"] == 1
    await reauthorize_kills(run, store, oauth)  # nothing left in doubt: nothing more
    assert run.counts["grants_reauthorized"] == 1


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize(("killed_owner", "presentations"), [
    (False, 0),  # a live owner's doubt: not the kill's doing
    (False, 1),
    (True, 2),  # the provider saw the token twice: a double refresh
])
async def test_the_operator_leaves_a_doubt_not_the_kills(
        store: WorkStore, killed_owner: bool, presentations: int) -> None:
    oauth = OAuthSimulator(client_secret="s", lifetime_s=70)
    run, _ = await _in_doubt(store, oauth, killed_owner=killed_owner)
    _present(oauth, presentations)
    await reauthorize_kills(run, store, oauth)
    assert await _grant(store) == (GrantState.NEEDS_REAUTHORIZATION, 1)
    assert run.counts["grants_reauthorized"] == 0


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_the_operator_acts_during_the_chaos_not_only_in_the_settle(
        database: FreshDatabase, store: WorkStore) -> None:
    """Left for the settle alone, a doubt early in a run held its binding's effects back
    for the rest of the chaos (a MariaDB phase: a backlog the settle could not drain)."""
    oauth = OAuthSimulator(client_secret="s", lifetime_s=70)
    run, _ = await _in_doubt(store, oauth, killed_owner=True)
    run.urls = [database.url]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(operator, run, oauth, 0.05)
        with trio.fail_after(60):
            while await _grant(store) != (GrantState.VALID, 2):  # noqa: ASYNC110
                await trio.sleep(0.05)  # (the operator's own loop: nothing to wait on)
        nursery.cancel_scope.cancel()
    assert run.counts["grants_reauthorized"] == 1
