"""Seed 13's refresh fault matrix with real OS processes: replicas that see an expired
token at once refresh it once; a refresh owner killed before its call left is taken over
after its lease; one killed once its call may have left (the dispatch marker is written)
leaves the grant in doubt, visibly, and its refresh token is never presented again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from config.settings import Secret
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.services.clock import WallClock
from daemon.services.token_refresh import RefreshEndpoint, TokenOwner
from sandbox.oauth_sim import OAuthSimulator, running_oauth
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import claim, enqueue

KEY = TokenKey("k1", bytes(range(32)))
CLIENT_SECRET = "client-SECRET-proc"
REPLICAS = 4


@pytest.fixture
async def oauth() -> AsyncIterator[tuple[OAuthSimulator, str]]:
    async with running_oauth(CLIENT_SECRET) as running:
        yield running


async def _seed(store: WorkStore, sim: OAuthSimulator, items: int) -> None:
    now = WallClock().now_us()
    sim.seed("refresh-SECRET-0")
    bundle = TokenBundle(access_token=SecretText("access-SECRET-0"),
                         refresh_token=SecretText("refresh-SECRET-0"), expires_at_us=now - 1)
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(bundle, KEY, BundleContext("b1", 1, 1)),
                              expires_at_us=now - 1, now_us=now)
    await enqueue(store, items, now=now)


def _spec(database: FreshDatabase, tmp_path: Path, url: str, owner: str,
          start_at: float, lease_s: float = 30.0) -> str:
    (tmp_path / "key").write_text(KEY.material.hex())
    (tmp_path / "client").write_text(CLIENT_SECRET)
    return json.dumps({"url": database.url, "owner": owner, "token_url": url,
                       "key_file": str(tmp_path / "key"),
                       "client_secret_file": str(tmp_path / "client"),
                       "start_at": start_at, "lease_s": lease_s})


async def _start(spec: str) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "sandbox.refresh_racer", spec], stdout=subprocess.PIPE)


async def _result(proc: trio.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    data = b""
    async for chunk in proc.stdout:
        data += chunk
    assert await proc.wait() == 0
    return dict(json.loads(data))


@pytest.mark.slow
async def test_replicas_that_see_an_expired_token_at_once_refresh_it_once(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    await _seed(store, sim, REPLICAS)
    start_at = time.time() + 3.0
    procs = [await _start(_spec(database, tmp_path, url, f"r{i}", start_at))
             for i in range(REPLICAS)]
    with trio.fail_after(90):
        results = [await _result(p) for p in procs]
    assert [r.get("version") for r in results] == [2] * REPLICAS, results
    assert [e["answer"] for e in sim.journal] == ["ok"]  # one call reached the provider
    assert await store.refresh_count("b1", 1) == 1


@pytest.mark.slow
async def test_a_refresh_owner_killed_mid_call_leaves_the_grant_in_doubt(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    sim, url = oauth
    await _seed(store, sim, 2)
    sim.hang = True
    first = await _start(_spec(database, tmp_path, url, "r0", time.time(), lease_s=3.0))
    with trio.fail_after(60):
        await sim.called.wait()  # the owner's call has reached the provider, and hangs
    first.send_signal(signal.SIGKILL)
    await first.wait()
    sim.hang = False
    second = await _start(_spec(database, tmp_path, url, "r1", time.time(), lease_s=3.0))
    with trio.fail_after(60):
        result = await _result(second)
    # The call left: whether the provider rotated the refresh token nobody here can know
    # (this one happens not to have). The second owner does not present it again; the
    # grant is in doubt and says so (before: it refreshed again, a double refresh that a
    # provider which had rotated answers invalid_grant).
    assert result["reason"] == "refresh_in_doubt", result
    assert [e["answer"] for e in sim.journal] == ["hang"]
    grant = await store.grant_get("b1", 1)
    assert grant is not None and grant.reason is not None
    assert (grant.token_version, grant.state.value, grant.reason.code) == (
        1, "needs_reauthorization", "refresh_in_doubt")


async def _stalled(proc: trio.Process) -> str:
    """The racer's first line once it stalls at its point (``{"stalled": POINT}``)."""
    assert proc.stdout is not None
    data = b""
    async for chunk in proc.stdout:
        data += chunk
        if b"\n" in data:
            break
    return str(json.loads(data.split(b"\n", 1)[0])["stalled"])


@pytest.mark.slow
@pytest.mark.parametrize(("point", "journal", "outcome"), [
    # The lease and its in-flight record were taken, the dispatch marker was not: the
    # refresh token never left, and the next owner refreshes with it once.
    ("before_dispatch", ["ok"], {"version": 2}),
    # The marker was written, the request never left: from the database this cannot be
    # told from a call that left, so it is in doubt (fail closed), and nobody calls.
    ("before_call", [], {"reason": "refresh_in_doubt"}),
    # The provider answered (and rotated the refresh token) but the new token was never
    # activated: it died with the process. The next owner does not present the spent
    # token (before: its one call was invalid_grant, a double refresh); the grant is in
    # doubt and says why.
    ("after_answer", ["ok"], {"reason": "refresh_in_doubt"}),
])
async def test_a_refresh_owner_killed_before_or_after_its_call_left(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str], point: str, journal: list[str],
        outcome: dict[str, object]) -> None:
    sim, url = oauth
    await _seed(store, sim, 2)
    spec = json.loads(_spec(database, tmp_path, url, "r0", time.time(), lease_s=6.0))
    first = await _start(json.dumps({**spec, "stall": point}))
    with trio.fail_after(60):
        assert await _stalled(first) == point
    first.send_signal(signal.SIGKILL)
    assert await first.wait() == -signal.SIGKILL  # killed there, not timed out
    second = await _start(_spec(database, tmp_path, url, "r1", time.time(), lease_s=6.0))
    with trio.fail_after(60):
        result = await _result(second)
    assert {k: v for k, v in result.items() if k in ("version", "reason")} == outcome, result
    assert [e["answer"] for e in sim.journal] == journal
    grant = await store.grant_get("b1", 1)
    assert grant is not None
    if point == "before_dispatch":
        assert (grant.token_version, grant.state.value) == (2, "valid")
        return
    assert "possibly spent by an unfinished refresh" in result["message"]
    # The grant stays at version 1, in doubt: visible (binding show, the console, the
    # gauge), and nobody presents its refresh token again.
    assert (grant.token_version, grant.state.value) == (1, "needs_reauthorization")
    assert grant.reason is not None and grant.reason.code == "refresh_in_doubt"
    assert "possibly spent by an unfinished refresh" in grant.reason.text
    await enqueue(store, 1, now=WallClock().now_us())  # a claim for the third racer
    third = await _start(_spec(database, tmp_path, url, "r2", time.time(), lease_s=6.0))
    with trio.fail_after(60):
        again = await _result(third)
    assert again["reason"] == "refresh_in_doubt", again
    assert [e["answer"] for e in sim.journal] == journal


def _stopped(pid: int) -> bool:
    """The process is stopped by a signal (``T`` in /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
async def test_stale_claimant_sigstopped_past_its_lease_never_reaches_token_endpoint(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        oauth: tuple[OAuthSimulator, str]) -> None:
    """Issue 20 item 1 with a real freeze: the racer takes the refresh lease (60 s) under
    its claim (a 3 s WorkItem lease) and SIGSTOPs itself before the dispatch marker; this
    process reclaims the item once its lease is over, then sends SIGCONT. Before: the
    woken racer wrote the marker (its refresh lease still lived), called the provider and
    activated version 2. Now: it stops with a lost lease, nothing reaches the provider,
    and the item's new owner refreshes once."""
    sim, url = oauth
    await _seed(store, sim, 1)
    spec = json.loads(_spec(database, tmp_path, url, "r0", time.time(), lease_s=60.0))
    first = await _start(json.dumps({**spec, "claim_s": 3, "stall": "sigstop_before_dispatch"}))
    try:
        with trio.fail_after(60):
            assert await _stalled(first) == "sigstop_before_dispatch"
            while True:  # polled: a stop is seen only in /proc, no event says so
                if _stopped(first.pid):
                    break
                await trio.sleep(0.05)
        reclaimed = None
        with trio.fail_after(60):
            while reclaimed is None:  # the racer's WorkItem lease ends while it is frozen
                got = await claim(store, owner="r1", now=WallClock().now_us(),
                                  ttl=600 * 1_000_000)
                reclaimed = got.claimed[0].fence if got.claimed else None
                await trio.sleep(0.1)
        assert await store.refresh_in_flight("b1", 1, WallClock().now_us())
    finally:
        first.send_signal(signal.SIGCONT)
    with trio.fail_after(60):
        result = await _result(first)
    assert result == {"owner": "r0", "reason": "lease_lost"}, result
    assert sim.journal == []  # the frozen claimant never reached the token endpoint
    grant = await store.grant_get("b1", 1)
    assert grant is not None and (grant.token_version, grant.state.value) == (1, "valid")
    # Its refresh lease ended unspent: the item's new owner refreshes now, once.
    assert not await store.refresh_in_flight("b1", 1, WallClock().now_us())
    async with httpx.AsyncClient() as http:
        owner = TokenOwner(store, {"k1": KEY}, "k1", http, WallClock())
        token = await owner.access_token(reclaimed, "b1", 1, RefreshEndpoint(
            url, "client-1", Secret(CLIENT_SECRET)))
    assert token.token_version == 2
    assert [e["answer"] for e in sim.journal] == ["ok"]
