"""Seed 13's fault row, through the Runtime's own connect flow: "Reconnect (generation
bump) between enqueue and dispatch: the queued work fails closed and never uses the new
identity".

A command is accepted under the binding's generation 1; the Runtime then reconnects the
binding through ``POST /v1/bindings/{id}/reconnect`` (real HTTP, with the grant of the
new authority): generation 2. A real replica process then claims the queued work and
refuses it before any call: the simulator (which would accept the old and the new token
alike) receives nothing, and the console's work item page says why.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from argon2 import PasswordHasher

from daemon.core.states import WorkState
from daemon.core.token_bundle import TokenKey
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.ports import free_port
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.e2e.test_effect_faults import replica_config
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.processes import ReplicaProcess, start_replica, stop_all
from tests.support.slice import (
    HUBSPOT_TOKEN,
    RESULTS_TOKEN,
    RUNTIME_TOKEN,
    SliceGrant,
    running_slice,
)

pytestmark = pytest.mark.slow

KEY = TokenKey("k1", bytes(range(32)))
NEW_TOKEN = "access-SECRET-after-reconnect"
PASSWORD = "reconnect-fault-pw"
AUTH = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}
SENTENCE = "the pinned binding generation 1 is no longer current (2)"
_ENV = {"INTEGRATIOND_RUNTIME_CRM_TOKEN": RUNTIME_TOKEN,
        "INTEGRATIOND_RUNTIME_CRM_RESULTS_TOKEN": RESULTS_TOKEN,
        "INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN": HUBSPOT_TOKEN}


async def _console(admin: str, work_id: str) -> tuple[str, dict[str, Any]]:
    """The work item's page and the bindings the console reports, signed in."""
    async with httpx.AsyncClient(base_url=admin, timeout=10) as client:
        form = await client.get("/admin/sign-in")
        found = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert found is not None
        r = await client.post("/admin/sign-in", data={
            "name": "ada", "password": PASSWORD, "csrf_token": found.group(1),
            "next": "/admin/"})
        assert r.status_code == 302, r.text
        page = await client.get(f"/admin/work/{work_id}")
        assert page.status_code == 200
        bindings = await client.get("/admin/api/bindings")
        assert bindings.status_code == 200
        return page.text, dict(bindings.json())


async def test_a_v1_reconnect_between_enqueue_and_dispatch_fails_closed(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    (tmp_path / "k1.key").write_text(KEY.material.hex())
    grant = SliceGrant(token_url="http://127.0.0.1:9/oauth/token", client_secret="unused",
                       key_dir=str(tmp_path), tokens={HUBSPOT_TOKEN, NEW_TOKEN})
    # Enqueue: the Runtime's command is accepted; nothing claims it yet.
    async with running_slice(store, database.url, with_replica=False, grant=grant) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent_id, "ACCEPTED")
        port = sl.hubspot_port
        # The Runtime reconnects: it reads the generation it will name, then CASes on it.
        seen = await sl.http.get(f"{sl.api_url}/v1/bindings/hubspot-main", headers=AUTH)
        assert seen.status_code == 200 and seen.json()["generation"] == 1, seen.text
        r = await sl.http.post(
            f"{sl.api_url}/v1/bindings/hubspot-main/reconnect", headers=AUTH,
            json={"idempotency_key": "reconnect-1", "expected_generation": 1,
                  "reason": "the portal was re-authorized",
                  "grant": {"type": "oauth_code_exchange", "access_token": NEW_TOKEN,
                            "expires_in": 3600}})
        assert r.status_code == 200, r.text
        assert (r.json()["generation"], r.json()["generation_bumped"]) == (2, True)
    (item,) = await store.work_list(WorkQuery(family="external_effect"))
    command = await store.command_get(item.subject_id)
    assert command is not None and command.binding_generation == 1
    # Dispatch: a real replica process (static token: the old identity's credential).
    cfg = replica_config(tmp_path / "a.toml", database.url, api_port=free_port(),
                         runtime_url="http://127.0.0.1:9",
                         hubspot_url=f"http://127.0.0.1:{port}")
    fast = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    (tmp_path / "session.secret").write_text("reconnect-fault-session-secret-0123456789\n")
    text = cfg.read_text().replace("max_in_flight = 2.5\n", "").replace(
        '[admin]\nlisten = "127.0.0.1:0"\n',
        f'[admin]\nlisten = "127.0.0.1:0"\nsession_secret_file = "{tmp_path}/session.secret"\n')
    cfg.write_text(text + f'\n[[operators]]\nname = "ada"\nrole = "operator"\n'
                   f'password_hash = "{fast.hash(PASSWORD)}"\n')
    replicas: list[ReplicaProcess] = []
    os.environ.update(_ENV)
    try:
        sim = HubSpotSimulator(tokens={HUBSPOT_TOKEN, NEW_TOKEN})
        sim.add_contact("101", jobtitle="Engineer")
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, "127.0.0.1", port)
            replica = await start_replica(cfg, "a")
            replicas.append(replica)

            async def finished() -> bool:
                got = await store.work_get(item.work_id)
                return got is not None and got.state.value not in ("pending", "retry",
                                                                   "processing")

            await wait_for(finished, within_s=60)
            got = await store.work_get(item.work_id)
            assert got is not None
            assert (got.state, got.terminal_outcome, got.failure_class) == (
                WorkState.SUCCEEDED, "no_effect", "binding_generation")
            assert SENTENCE in (got.operator_summary or "")
            assert sim.requests == []  # neither the old identity nor the new one
            assert await store.effect_attempts(item.subject_id) == []
            started = await replica.wait_event("replica_started")
            page, bindings = await _console(str(started["admin"]), item.work_id)
            assert "binding_generation" in page and SENTENCE in page
            assert NEW_TOKEN not in page and HUBSPOT_TOKEN not in page
            # The bindings page: generation 2, its new grant, and the reconnect (1 -> 2)
            # by the Runtime in the binding's history.
            (main,) = bindings["items"]
            assert main["durable"]["generation"] == 2
            assert (main["grant"]["state"], main["grant"]["token_version"]) == ("valid", 1)
            last = main["history"][0]
            assert (last["actor"], last["action"], last["generation_before"],
                    last["generation_after"]) == ("runtime:crm", "binding.reconnect", 1, 2)
            assert NEW_TOKEN not in json.dumps(bindings)
            nursery.cancel_scope.cancel()
    finally:
        await stop_all(replicas)
        for name in _ENV:
            os.environ.pop(name, None)
    # The reconnect is in the audit log with the Runtime as actor; never its token.
    entries = [e for e in await store.audit_list(target_id="hubspot-main")
               if e.action == "binding.reconnect"]
    assert [(e.actor, e.role) for e in entries] == [("runtime:crm", "runtime")]
    assert NEW_TOKEN not in entries[0].after
