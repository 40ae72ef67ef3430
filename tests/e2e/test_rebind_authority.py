"""After a rebind, the durable binding is the authority for new work (issue 9, item 1).

The operator (or the Runtime's connect flow) rebinds ``hubspot-main`` from remote account
portal-1 to portal-2; the TOML's ``[[bindings]]`` entry still says portal-1. A command
admitted *after* the rebind is scoped by the durable binding's account: its link key is
portal-2's, so a Lead linked only under portal-1 has no link for it and the command is
refused before dispatch (``no_remote_link``); it is never sent to portal-2's credentials
with portal-1's remote id. A Lead linked under portal-2 is sent as usual.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest
import trio

from daemon.core.identity import integration_link_key_v2, integration_scope_digest
from daemon.core.principals import BindingEvent
from daemon.core.states import WorkState
from daemon.core.token_bundle import TokenKey
from daemon.services.clock import WallClock
from daemon.services.principal_bootstrap import ensure_config_bindings
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.ports import free_port
from storage.effect_values import Settlement
from storage.port import WorkQuery
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.e2e.test_effect_faults import replica_config
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.processes import ReplicaProcess, run_cli, start_replica, stop_all
from tests.support.slice import (
    HUBSPOT_TOKEN,
    LINK_SCOPE,
    RESULTS_TOKEN,
    RUNTIME_TOKEN,
    SCOPE,
    SliceGrant,
    running_slice,
)

pytestmark = pytest.mark.slow

KEY = TokenKey("k1", bytes(range(32)))
B_SCOPE = integration_scope_digest(SCOPE.org_id, SCOPE.app_installation_id, "hubspot",
                                   "portal-2")


async def rebind_to_portal_2(store: WorkStore) -> None:
    """The audited transition (what `/v1/bindings/.../rebind` and the CLI apply)."""
    current = await store.binding_get("hubspot-main")
    assert current is not None and current.identity.remote_account_id == "portal-1"
    moved = await store.binding_transition(
        "hubspot-main", BindingEvent.CHANGE,
        Actor(name="ada", role="admin", reason="the org moved to portal 2"),
        expected_generation=current.generation, now_us=WallClock().now_us(),
        identity=attrs.evolve(current.identity, remote_account_id="portal-2",
                              remote_subject="portal-2"))
    assert moved.generation == current.generation + 1


async def test_a_command_admitted_after_a_rebind_uses_the_durable_account(
        database: FreshDatabase, store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        # lead-1 is linked under portal-1 (before the rebind) to contact 101; lead-2 is
        # linked under portal-2 to contact 202 (the new account's record).
        await sl.lead("lead-1", "101")
        await sl.lead("lead-2", "202", link=False)
        await ensure_config_bindings(store, sl.settings.bindings, WallClock().now_us())
        await rebind_to_portal_2(store)
        await store.link_adopt(B_SCOPE, "lead", "lead-2", "contact", "202", actor="ada",
                               role="admin", reason="the lead's contact in portal 2",
                               now_us=WallClock().now_us())
        one = await sl.set_title("lead-1", "CTO")
        two = await sl.set_title("lead-2", "CFO")
        await sl.wait_intent("lead-2", two, "COMMITTED")
        await sl.wait_intent("lead-1", one, "COMMITTED")
        items = {i.subject_id: i for i in await store.work_list(
            WorkQuery(family="external_effect"))}
        commands = {c.local_id: c for c in [await store.command_get(s) for s in items]
                    if c is not None}
        # Both commands pin the durable generation (2) and portal-2's link scope.
        for lead in ("lead-1", "lead-2"):
            assert commands[lead].binding_generation == 2
            assert commands[lead].link_key == integration_link_key_v2(B_SCOPE, "lead", lead)
        assert commands["lead-1"].link_key != integration_link_key_v2(LINK_SCOPE, "lead",
                                                                      "lead-1")
        # lead-1: refused before dispatch, with a stable reason; nothing was sent.
        c1 = commands["lead-1"]
        assert (c1.remote_id, c1.settlement) == (None, Settlement.NO_EFFECT)
        got = await store.work_get(items[c1.command_id].work_id)
        assert got is not None
        assert (got.state, got.terminal_outcome, got.failure_class) == (
            WorkState.SUCCEEDED, "no_effect", "no_remote_link")
        assert await store.effect_attempts(c1.command_id) == []
        # The simulator saw one PATCH, for portal-2's contact 202, and nothing for 101.
        assert [(r.method, r.contact_id) for r in sl.sim.requests
                if r.method == "PATCH"] == [("PATCH", "202")]
        assert sl.patches("101") == []
        untouched = sl.sim.contact("101")
        assert untouched is not None and untouched["patches_applied"] == 0


NEW_TOKEN = "access-SECRET-portal-2"
AUTH = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}
_ENV = {"INTEGRATIOND_RUNTIME_CRM_TOKEN": RUNTIME_TOKEN,
        "INTEGRATIOND_RUNTIME_CRM_RESULTS_TOKEN": RESULTS_TOKEN,
        "INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN": HUBSPOT_TOKEN}


async def test_a_v1_rebind_then_a_replica_process_sends_nothing_with_the_old_account(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    """The Runtime rebinds through ``/v1/``; the TOML still says portal-1. A real replica
    process starts (warning that the file and the durable fact disagree; the durable one
    wins), refuses the queued command (``binding_generation``) and the new one for the
    Lead linked only under portal-1 (``no_remote_link``), and sends the new one for the
    Lead linked under portal-2: the simulator receives that PATCH and nothing else."""
    (tmp_path / "k1.key").write_text(KEY.material.hex())
    grant = SliceGrant(token_url="http://127.0.0.1:9/oauth/token", client_secret="unused",
                       key_dir=str(tmp_path), tokens={HUBSPOT_TOKEN, NEW_TOKEN})
    async with running_slice(store, database.url, with_replica=False, grant=grant) as sl:
        await sl.lead("lead-1", "101")
        await sl.lead("lead-2", "202", link=False)
        queued = await sl.set_title("lead-1", "CTO")  # before the rebind: generation 1
        await sl.wait_intent("lead-1", queued, "ACCEPTED")
        port = sl.hubspot_port
        r = await sl.http.post(
            f"{sl.api_url}/v1/bindings/hubspot-main/rebind", headers=AUTH,
            json={"idempotency_key": "rebind-1", "expected_generation": 1,
                  "reason": "the org moved to portal 2",
                  "identity": {"remote_account_id": "portal-2",
                               "remote_subject": "portal-2"},
                  "grant": {"type": "oauth_code_exchange", "access_token": NEW_TOKEN,
                            "expires_in": 3600}})
        assert r.status_code == 200, r.text
        assert (r.json()["generation"], r.json()["generation_bumped"]) == (2, True)
        await store.link_adopt(B_SCOPE, "lead", "lead-2", "contact", "202", actor="ada",
                               role="admin", reason="the lead's contact in portal 2",
                               now_us=WallClock().now_us())
        after = await sl.set_title("lead-1", "CEO")  # after it: generation 2, portal-2
        other = await sl.set_title("lead-2", "CFO")
        for lead, intent in (("lead-1", after), ("lead-2", other)):
            await sl.wait_intent(lead, intent, "ACCEPTED")
    items = await store.work_list(WorkQuery(family="external_effect"))
    assert len(items) == 3
    cfg = replica_config(tmp_path / "a.toml", database.url, api_port=free_port(),
                         runtime_url="http://127.0.0.1:9",
                         hubspot_url=f"http://127.0.0.1:{port}")
    # The slice's Catalog revision (no L2 in-flight window); the binding's TOML entry
    # still names portal-1: nobody edited the file after the rebind.
    cfg.write_text(cfg.read_text().replace("max_in_flight = 2.5\n", ""))
    assert 'remote_account_id = "portal-1"' in cfg.read_text()
    replicas: list[ReplicaProcess] = []
    os.environ.update(_ENV)
    try:
        sim = HubSpotSimulator(tokens={HUBSPOT_TOKEN, NEW_TOKEN})
        sim.add_contact("101", jobtitle="Engineer")
        sim.add_contact("202", jobtitle="Engineer")
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, "127.0.0.1", port)
            replica = await start_replica(cfg, "a")
            replicas.append(replica)
            drift = await replica.wait_event("binding_account_not_from_config")
            assert (drift["binding_id"], drift["configured"], drift["durable"]) == (
                "hubspot-main", "portal-1", "portal-2")

            async def finished() -> bool:
                got = [await store.work_get(i.work_id) for i in items]
                return all(g is not None and g.state.value not in (
                    "pending", "retry", "processing") for g in got)

            await wait_for(finished, within_s=60)
            status = run_cli(cfg, "binding", "status")
            nursery.cancel_scope.cancel()
    finally:
        await stop_all(replicas)
        for name in _ENV:
            os.environ.pop(name, None)
    outcomes = {}
    for i in items:
        got = await store.work_get(i.work_id)
        command = await store.command_get(i.subject_id)
        assert got is not None and command is not None
        outcomes[(command.local_id, command.binding_generation)] = (
            got.state, got.terminal_outcome, got.failure_class)
    assert outcomes == {
        ("lead-1", 1): (WorkState.SUCCEEDED, "no_effect", "binding_generation"),
        ("lead-1", 2): (WorkState.SUCCEEDED, "no_effect", "no_remote_link"),
        ("lead-2", 2): (WorkState.SUCCEEDED, "succeeded", None),
    }
    # The simulator received exactly one request: portal-2's record, never 101.
    assert [(q.method, q.contact_id) for q in sim.requests] == [("PATCH", "202")]
    untouched = sim.contact("101")
    assert untouched is not None and untouched["patches_applied"] == 0
    # One line per configured binding shows the drift; the durable value wins.
    assert status.returncode == 0, status.stderr
    assert status.stdout == (
        "hubspot-main: generation 2 connected, account portal-2; drift (the durable value"
        " wins): generation configured 1 durable 2, remote_account_id configured portal-1"
        " durable portal-2\n")
    # No token in the replica's log or the CLI's output.
    for text in (replica.log.read_text(), status.stdout, status.stderr):
        assert NEW_TOKEN not in text and HUBSPOT_TOKEN not in text
