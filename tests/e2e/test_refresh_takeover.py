"""The refresh owner SIGKILLed after the provider answered but before activation, and the
next owner is a replica's waiting effect (issue 9, fault matrix; real OS processes on
SQLite and MariaDB).

A ``sandbox.refresh_racer`` process takes the refresh lease of ``hubspot-main``, calls
the OAuth simulator (which rotates the refresh token: the old one is spent) and is
killed before it activates the answer. An ``integrationd run`` replica then dispatches
an effect on that binding: its token is expired, so it waits for the lease, takes it
over once it expired, treats the old refresh token as possibly spent and says so. The
simulator answers ``invalid_grant`` to its one call; the grant needs re-authorization
(the console and ``binding show`` say so), the work fails closed with that reason, and
nothing is sent to the provider, nor retried.
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
    _signed_in,
    _sims,
)
from tests.support.backends import FreshDatabase
from tests.support.processes import cli_env, run_cli, start_replica, stop_all
from tests.support.work import enqueue

pytestmark = pytest.mark.slow


async def test_owner_killed_after_the_answer_the_replica_says_the_token_was_possibly_spent(
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
            assert await _settled(store, 1) == [
                ("succeeded", "no_effect", "needs_reauthorization")]
            # One call by the next owner, refused; never a loop.
            assert [e["answer"] for e in sims.oauth.journal] == ["ok", "invalid_grant"]
            assert [r for r in w.sim.requests if r.method == "PATCH"] == []
            (item,) = await store.work_list(WorkQuery(family="external_effect"))
            shown = run_cli(cfg, "work", "show", item.work_id, "--json", env=_env())
            assert shown.returncode == 0, shown.stderr
            assert "possibly spent by an unfinished refresh" in shown.stdout
            binding = run_cli(cfg, "binding", "show", "hubspot-main", env=_env())
            assert binding.returncode == 0, binding.stderr
            grant = json.loads(binding.stdout)["grant"]
            assert (grant["state"], grant["token_version"]) == ("needs_reauthorization", 1)
            # Why, durably on the grant (long after the work item and the log line).
            assert grant["reason"]["code"] == "refresh_token_possibly_spent"
            assert "possibly spent by an unfinished refresh" in grant["reason"]["text"]
            client = await _signed_in(replica.admin, "viv")
            try:
                (b,) = (await client.get("/admin/api/bindings")).json()["items"]
            finally:
                await client.aclose()
            assert b["grant"]["state"] == "needs_reauthorization"
            assert b["grant"]["reason"] == grant["reason"]
            failed = [e for e in replica.events() if e.get("event") == "token_refresh_failed"]
            assert [(e["reason"], e["possibly_spent"]) for e in failed] == [
                ("invalid_grant", True)]
        finally:
            await stop_all([replica])
