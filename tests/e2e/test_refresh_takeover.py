"""The refresh owner SIGKILLed after the provider answered but before activation, and the
next owner is a replica's waiting effect (issue 9, fault matrix; real OS processes on
SQLite and MariaDB).

A ``sandbox.refresh_racer`` process takes the refresh lease of ``hubspot-main``, writes
its dispatch marker, calls the OAuth simulator (which rotates the refresh token: the old
one is spent) and is killed before it activates the answer: the rotated token died with
it. An ``integrationd run`` replica then dispatches an effect on that binding: its token
is expired, so it waits for the lease; once the lease expired it finds the marker and
never presents the spent token (before: it did, and the provider's invalid_grant was a
double refresh; with reuse detection a provider revokes the whole grant). The grant is
in doubt, visibly (``binding show``, the console, the gauge); the effect is not failed:
it waits, unsent, and completes once the binding is re-authorized.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, seal
from daemon.services.clock import WallClock
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.e2e.test_effect_faults import world
from tests.e2e.test_refresh_processes import _stalled
from tests.e2e.test_secret_scan import (
    CLIENT_SECRET,
    K1,
    REFRESH,
    STALE,
    _config,
    _env,
    _install,
    _lead,
    _settled,
    _sims,
)
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.processes import cli_env, run_cli, start_replica, stop_all
from tests.support.secret_scan import signed_in
from tests.support.work import enqueue

pytestmark = pytest.mark.slow


async def test_owner_killed_after_the_answer_the_grant_is_in_doubt_and_the_effect_waits(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with world(database, tmp_path) as w, _sims() as sims:
        os.environ.pop("INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN", None)
        w.sim.tokens = sims.oauth.access_tokens
        cfg = _config(w, sims, tmp_path)
        sims.oauth.seed(REFRESH)
        await _install(store, "hubspot-main", STALE, REFRESH, -1)  # expired
        # The racer takes the lease and is killed once the provider has answered.
        await enqueue(store, 1, now=WallClock().now_us())
        (tmp_path / "racer.key").write_text(K1.material.hex())
        (tmp_path / "racer.client").write_text(CLIENT_SECRET)
        spec = {"url": database.url, "owner": "racer", "binding_id": "hubspot-main",
                "token_url": sims.token_url, "key_file": str(tmp_path / "racer.key"),
                "client_secret_file": str(tmp_path / "racer.client"),
                "start_at": time.time(), "lease_s": 6.0, "stall": "after_answer"}
        racer = await trio.lowlevel.open_process(
            [sys.executable, "-m", "sandbox.refresh_racer", json.dumps(spec)],
            stdout=subprocess.PIPE,
            env=cli_env())
        with trio.fail_after(60):
            assert await _stalled(racer) == "after_answer"
        racer.send_signal(signal.SIGKILL)
        assert await racer.wait() == -signal.SIGKILL
        assert [e["answer"] for e in sims.oauth.journal] == ["ok"]  # the token is spent

        replica = await start_replica(cfg, "a")
        try:
            await _lead(w, store, "lead-1", "101")

            async def deferred_in_doubt_twice() -> bool:
                items = await store.work_list(WorkQuery(family="external_effect"))
                if not items:
                    return False
                executions = await store.work_executions(items[0].work_id)
                return sum(e.outcome == "deferred" and e.reason == "refresh_in_doubt"
                           for e in executions) >= 2

            await wait_for(deferred_in_doubt_twice, within_s=90)
            # Nobody presented the spent refresh token again; nothing reached HubSpot.
            assert [e["answer"] for e in sims.oauth.journal] == ["ok"]
            assert [r for r in w.sim.requests if r.method == "PATCH"] == []
            (item,) = await store.work_list(WorkQuery(family="external_effect"))
            assert item.state.value not in ("succeeded", "dead")  # waiting, not failed
            assert item.attempt == 0  # deferrals burn no attempt
            shown = run_cli(cfg, "work", "show", item.work_id, "--json", env=_env())
            assert shown.returncode == 0, shown.stderr
            assert "refresh_in_doubt" in shown.stdout
            binding = run_cli(cfg, "binding", "show", "hubspot-main", "--json", env=_env())
            assert binding.returncode == 0, binding.stderr
            grant = json.loads(binding.stdout)["grant"]
            assert (grant["state"], grant["token_version"]) == ("needs_reauthorization", 1)
            # Why, durably on the grant (long after the work item and the log line).
            assert grant["reason"]["code"] == "refresh_in_doubt"
            assert "possibly spent by an unfinished refresh" in grant["reason"]["text"]
            client = await signed_in(replica.admin, "viv")
            try:
                (b,) = (await client.get("/admin/api/bindings")).json()["items"]
            finally:
                await client.aclose()
            assert b["grant"]["state"] == "needs_reauthorization"
            assert b["grant"]["reason"] == grant["reason"]

            async def gauge_shows_it() -> bool:
                status, metrics = await replica.get("/metrics")
                return status == 200 and ('integrationd_grants_needing_reauthorization'
                                          '{reason="refresh_in_doubt"} 1.0') in \
                    metrics.decode()

            await wait_for(gauge_shows_it, within_s=60)
            found = [e for e in replica.events() if e.get("event") == "token_refresh_in_doubt"]
            assert found and all(e["from_version"] == 1 for e in found)

            # Re-authorized (the connect flows' new grant of the generation): the waiting
            # effect completes with it, once.
            fresh = "access-SECRET-reauthorized"
            sims.oauth.access_tokens.add(fresh)
            now = WallClock().now_us()
            bundle = TokenBundle(access_token=SecretText(fresh),
                                 refresh_token=SecretText("refresh-SECRET-reauthorized"),
                                 expires_at_us=now + 3_600_000_000)
            assert await store.grant_replace(
                binding_id="hubspot-main", generation=1, expected_version=1,
                sealed=seal(bundle, K1, BundleContext("hubspot-main", 1, 2)),
                expires_at_us=bundle.expires_at_us, now_us=now, refreshed=False)
            assert await _settled(store, 1) == [("succeeded", "succeeded", "")]
            assert [r.status for r in w.sim.requests if r.method == "PATCH"] == [200]
            assert [e["answer"] for e in sims.oauth.journal] == ["ok"]
        finally:
            await stop_all([replica])
