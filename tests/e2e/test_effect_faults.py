"""Seed 13's fault matrix for the effect path, with real replica processes.

* a stale claimant (SIGSTOP past its lease while another replica reclaims)
  cannot dispatch again or finalize;
* SIGKILL after the dispatch checkpoint: the next owner reconciles, never
  resends blindly;
* a replica that died after claiming but before the checkpoint: the next
  owner dispatches exactly once.

They run on SQLite, MariaDB and Galera (issue 12); on Galera the two replicas are on
different nodes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from config.catalog import load_catalog
from config.load import load_settings
from daemon.core.states import WorkState
from daemon.services.catalog_view import publish_current
from daemon.services.clock import WallClock
from daemon.services.families import known_family_names
from sandbox.hubspot_sim import Fault, HubSpotSimulator
from sandbox.ports import free_port
from sandbox.runtime import ReferenceRuntime
from sandbox.runtime.server import serve as serve_runtime
from storage.port import ClaimParams, WorkQuery
from storage.work_store import WorkStore
from tests.support.attempts import sent_attempts
from tests.support.backends import STORAGE_BACKENDS, FreshDatabase, backend_params
from tests.support.harness import wait_for
from tests.support.l1 import sandbox_definitions_dir
from tests.support.processes import ReplicaProcess, run_cli, start_replica, stop_all
from tests.support.slice import (
    HUBSPOT_TOKEN,
    LINK_SCOPE,
    RESULTS_TOKEN,
    RUNTIME_TOKEN,
    SCOPE,
    running_slice,
)

pytestmark = pytest.mark.slow


@pytest.fixture(params=backend_params(STORAGE_BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "galera":
        request.getfixturevalue("galera_cluster")
    return str(request.param)


def replica_config(path: Path, db_url: str, *, api_port: int, runtime_url: str,
                   hubspot_url: str, definitions_dir: str = "") -> Path:
    # The sandbox L1 declares 1 s; the binding lengthens it to 2.5 s.
    definitions_dir = definitions_dir or sandbox_definitions_dir()
    path.write_text(f"""
[storage]
url = "{db_url}"
sqlite_synchronous = "NORMAL"
[admin]
listen = "127.0.0.1:0"
[api]
listen = "127.0.0.1:{api_port}"
[replica]
drain_timeout = 3.0
heartbeat_interval = 1.0
[work]
poll_interval = 0.1
reclaim_interval = 0.3
lease_margin = 1.0
[catalog]
revision = 7
definitions_dir = "{definitions_dir}"
[families.external_effect]
lease_ttl = 3.0
backoff_base = 0.2
backoff_cap = 1.0
[families.runtime_receipt]
lease_ttl = 3.0
backoff_base = 0.2
backoff_cap = 1.0
max_attempts = 1000000
[[runtimes]]
name = "crm"
org_id = "{SCOPE.org_id}"
app_installation_id = "{SCOPE.app_installation_id}"
runtime_capability_id = "{SCOPE.runtime_capability_id}"
runtime_work_binding_digest = "{SCOPE.runtime_work_binding_digest}"
results_url = "{runtime_url}/runtime/v1/results"
[[bindings]]
binding_id = "hubspot-main"
provider = "hubspot"
org_id = "{SCOPE.org_id}"
app_installation_id = "{SCOPE.app_installation_id}"
remote_account_id = "portal-1"
base_url = "{hubspot_url}"
timeout = 5.0
max_in_flight = 2.5
auth = "static_token"
""")
    return path


@attrs.define
class World:
    sim: HubSpotSimulator
    runtime_url: str
    api_port: int
    config: Path
    http: httpx.AsyncClient
    # The first replica's database URL and the second's (on Galera, another node).
    url: str
    second_url: str


@asynccontextmanager
async def world(database: FreshDatabase, tmp_path: Path,
                definitions_dir: str = "") -> AsyncIterator[World]:
    sim = HubSpotSimulator(tokens={HUBSPOT_TOKEN})
    api_port = free_port()
    os.environ["INTEGRATIOND_RUNTIME_CRM_TOKEN"] = RUNTIME_TOKEN
    os.environ["INTEGRATIOND_RUNTIME_CRM_RESULTS_TOKEN"] = RESULTS_TOKEN
    os.environ["INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN"] = HUBSPOT_TOKEN
    try:
        async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=10) as http:
            sim_port = await nursery.start(sim.run)
            runtime = ReferenceRuntime(
                scope=SCOPE, integration_url=f"http://127.0.0.1:{api_port}",
                integration_token=RUNTIME_TOKEN, results_token=RESULTS_TOKEN,
                catalog_revision=7, poll_interval_s=0.1)
            runtime_port = await nursery.start(serve_runtime, runtime)
            runtime_url = f"http://127.0.0.1:{runtime_port}"
            cfg = replica_config(tmp_path / "a.toml", database.url, api_port=api_port,
                                 runtime_url=runtime_url,
                                 hubspot_url=f"http://127.0.0.1:{sim_port}",
                                 definitions_dir=definitions_dir)
            # The replicas serve revision 7: publish it (``run`` publishes nothing).
            store = await database.open_store()
            catalog = load_catalog(load_settings(str(cfg), known_families=known_family_names()))
            await publish_current(store, catalog, actor="test", role="admin",
                                  reason="fault tests", now_us=WallClock().now_us())
            second = database.node_urls[1] if database.node_urls else database.url
            yield World(sim, runtime_url, api_port, cfg, http, database.url, second)
            nursery.cancel_scope.cancel()
    finally:
        for name in ("INTEGRATIOND_RUNTIME_CRM_TOKEN", "INTEGRATIOND_RUNTIME_CRM_RESULTS_TOKEN",
                     "INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN"):
            os.environ.pop(name, None)


async def _setup_lead(w: World, store: WorkStore, latency_ms: int = 1500,
                      unchanged_for_s: float = 0.0) -> str:
    w.sim.add_contact("101", jobtitle="Engineer")
    # A read-back proves absence only of a record last changed more than the clock
    # skew (2 s) before the dispatch.
    await trio.sleep(unchanged_for_s)
    assert (await w.http.post(f"{w.runtime_url}/leads",
                              json={"lead_id": "lead-1", "title": "Engineer"})).status_code == 201
    await store.link_adopt(LINK_SCOPE, "lead", "lead-1", "contact", "101", actor="test",
                           role="admin", reason="setup", now_us=time.time_ns() // 1000)
    # A slow provider: the PATCH is applied and answered latency_ms after it arrives.
    w.sim.inject(Fault(mode="latency", method="PATCH", latency_ms=latency_ms))
    r = await w.http.patch(f"{w.runtime_url}/leads/lead-1", json={"title": "CTO"})
    assert r.status_code == 200
    return str(r.json()["intent_id"])


async def _intent_status(w: World, intent_id: str) -> str:
    doc = (await w.http.get(f"{w.runtime_url}/leads/lead-1")).json()
    return str(next(i["status"] for i in doc["intents"] if i["intent_id"] == intent_id))


async def _second_replica(w: World, tmp_path: Path) -> ReplicaProcess:
    cfg_b = tmp_path / "b.toml"
    cfg_b.write_text(w.config.read_text()
                     .replace(f"127.0.0.1:{w.api_port}", f"127.0.0.1:{free_port()}")
                     .replace(f'url = "{w.url}"', f'url = "{w.second_url}"'))
    return await start_replica(cfg_b, "b")


async def test_stale_claimant_cannot_dispatch_or_finalize(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    async with world(database, tmp_path) as w:
        a = await start_replica(w.config, "a")
        started = [a]
        try:
            intent_id = await _setup_lead(w, store)
            # The latency fault is taken when the PATCH arrives (it is journaled later).
            await wait_for(lambda: not w.sim.pending_faults())
            a.proc.send_signal(signal.SIGSTOP)  # A is mid-request, frozen past its lease
            b = await _second_replica(w, tmp_path)
            started.append(b)

            async def committed() -> bool:
                return await _intent_status(w, intent_id) == "COMMITTED"

            await wait_for(committed, within_s=60)
            a.proc.send_signal(signal.SIGCONT)
            await trio.sleep(2.0)  # A wakes up with a dead lease
            assert [r.applied for r in w.sim.requests if r.method == "PATCH"] == [True]
            (item,) = await store.work_list(WorkQuery(family="external_effect"))
            assert (item.state, item.ownership_epoch) == (WorkState.SUCCEEDED, 2)
            command_id = item.subject_id
            (attempt,) = sent_attempts(await store.effect_attempts(command_id))
            assert attempt.ownership_epoch == 1 and attempt.disposition == "proven_applied"
            executions = await store.work_executions(item.work_id)
            # A never finalized: its execution is journaled as superseded by B's reclaim.
            assert [(e.ownership_epoch, e.outcome) for e in executions] == [
                (1, "lease_lost"), (2, "succeeded")]
            assert a.proc.returncode is None  # the stale replica did not crash
            assert any(e["event"] == "work_lease_lost" for e in a.events())
        finally:
            for r in started:
                if r.proc.returncode is None:
                    r.proc.send_signal(signal.SIGCONT)
            await stop_all(started)


async def test_sigkill_after_the_checkpoint_is_reconciled_not_resent(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    async with world(database, tmp_path) as w:
        a = await start_replica(w.config, "a")
        started = [a]
        try:
            intent_id = await _setup_lead(w, store)
            await wait_for(lambda: not w.sim.pending_faults())  # the PATCH has arrived
            a.kill()
            await a.wait()
            b = await _second_replica(w, tmp_path)
            started.append(b)

            async def committed() -> bool:
                return await _intent_status(w, intent_id) == "COMMITTED"

            await wait_for(committed, within_s=60)
            assert len([r for r in w.sim.requests if r.method == "PATCH"]) == 1
            (item,) = await store.work_list(WorkQuery(family="external_effect"))
            (attempt,) = sent_attempts(await store.effect_attempts(item.subject_id))
            assert (attempt.outcome, attempt.disposition) == (None, "proven_applied")
        finally:
            await stop_all(started)


async def test_absence_counts_the_window_from_when_the_client_gave_up_not_from_dispatch(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    """Issue 8, item 11: absence is proven from the later of the dispatch and the moment
    the client gave up on the exchange, plus the in-flight window.

    The binding's client gives up on an exchange 10 s after the dispatch at the latest
    (two 5 s timeouts: a free connection, then the request); the window is 2.5 s.
    Replica A dispatches and is killed with the PATCH still at the provider, which
    applies it 6 s after it arrived: later than dispatch + window, within give-up +
    window. Counting the window from the dispatch (as before), B's read-back 3-5 s
    after the dispatch saw the record unmodified, "proved" the PATCH absent and sent it
    again: two applied PATCHes. Counted from the (unrecorded, so latest possible)
    give-up, B waits until 12.5 s, reads the applied value back and settles: one."""
    latency_s = 6.0
    async with world(database, tmp_path) as w:
        a = await start_replica(w.config, "a")
        started = [a]
        try:
            intent_id = await _setup_lead(w, store, latency_ms=int(latency_s * 1000),
                                          unchanged_for_s=2.5)
            await wait_for(lambda: not w.sim.pending_faults())  # the PATCH has arrived
            arrived = trio.current_time()
            a.kill()
            await a.wait()
            b = await _second_replica(w, tmp_path)
            started.append(b)

            async def committed() -> bool:
                return await _intent_status(w, intent_id) == "COMMITTED"

            await wait_for(committed, within_s=60)
            # The slow PATCH has landed (and been journaled) by now.
            await trio.sleep(max(0.0, arrived + latency_s + 1.0 - trio.current_time()))
            patches = [r for r in w.sim.requests if r.method == "PATCH"]
            assert [r.applied for r in patches] == [True], "the PATCH was sent again"
            assert w.sim.patches_applied("101") == 1
            (item,) = await store.work_list(WorkQuery(family="external_effect"))
            (attempt,) = sent_attempts(await store.effect_attempts(item.subject_id))
            assert (attempt.outcome, attempt.disposition) == (None, "proven_applied")
        finally:
            await stop_all(started)


async def test_claimed_but_not_checkpointed_dispatches_exactly_once(
    database: FreshDatabase, store: WorkStore
) -> None:
    async with running_slice(store, database.url, with_replica=False, lease_ttl=2.0) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent_id, "ACCEPTED")
        # A replica claims the effect and dies before writing its checkpoint.
        dead = await store.work_claim(ClaimParams(
            family="external_effect", owner="died-after-claim", limit=1,
            lease_ttl_us=1_000_000), time.time_ns() // 1000)
        assert len(dead.claimed) == 1
    async with running_slice(store, database.url, lease_ttl=2.0,
                             hubspot_port=sl.hubspot_port) as sl2:
        sl2.sim.add_contact("101", jobtitle="Engineer")
        await wait_for(lambda: sl2.patches("101"), within_s=30)
        (item,) = await store.work_list(WorkQuery(family="external_effect"))

        async def settled() -> bool:
            got = await store.work_get(item.work_id)
            return got is not None and got.state is WorkState.SUCCEEDED

        await wait_for(settled, within_s=30)
        assert len(sl2.patches("101")) == 1
        got = await store.work_get(item.work_id)
        assert got is not None and got.ownership_epoch == 2


async def test_reconnect_between_enqueue_and_dispatch_fails_closed(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    """Seed 13: a reconnect (a generation bump, by an operator's CLI process) between
    acceptance and dispatch: a real replica process refuses the queued work before any
    call, and the simulator receives nothing, neither with the old identity nor the new."""
    async with running_slice(store, database.url, with_replica=False) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent_id, "ACCEPTED")
        port = sl.hubspot_port
    cfg = replica_config(tmp_path / "a.toml", database.url, api_port=free_port(),
                         runtime_url="http://127.0.0.1:9",
                         hubspot_url=f"http://127.0.0.1:{port}")
    # The same binding content as the slice published (the pinned revision).
    cfg.write_text(cfg.read_text().replace("max_in_flight = 2.5\n", "")
                   + '\n[[operators]]\nname = "ada"\nrole = "operator"\n')
    replicas: list[ReplicaProcess] = []
    try:
        os.environ["INTEGRATIOND_RUNTIME_CRM_TOKEN"] = RUNTIME_TOKEN
        os.environ["INTEGRATIOND_RUNTIME_CRM_RESULTS_TOKEN"] = RESULTS_TOKEN
        os.environ["INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN"] = HUBSPOT_TOKEN
        who = ("--actor", "ada", "--reason", "the portal was reinstalled")
        off = run_cli(cfg, "binding", "disconnect", "hubspot-main", *who, "--generation", "1")
        assert off.returncode == 0, off.stderr
        on = run_cli(cfg, "binding", "reconnect", "hubspot-main", *who, "--generation", "1")
        assert on.returncode == 0, on.stderr
        sim = HubSpotSimulator(tokens={HUBSPOT_TOKEN})
        sim.add_contact("101", jobtitle="Engineer")
        async with trio.open_nursery() as nursery:
            await nursery.start(sim.run, "127.0.0.1", port)
            replicas.append(await start_replica(cfg, "a"))
            (item,) = await store.work_list(WorkQuery(family="external_effect"))

            async def finished() -> bool:
                got = await store.work_get(item.work_id)
                return got is not None and got.state.value not in ("pending", "retry",
                                                                   "processing")

            await wait_for(finished, within_s=60)
            got = await store.work_get(item.work_id)
            assert got is not None
            assert (got.state, got.terminal_outcome, got.failure_class) == (
                WorkState.SUCCEEDED, "no_effect", "binding_generation")
            assert sim.requests == []
            assert await store.effect_attempts(item.subject_id) == []
            nursery.cancel_scope.cancel()
    finally:
        await stop_all(replicas)
        for name in ("INTEGRATIOND_RUNTIME_CRM_TOKEN", "INTEGRATIOND_RUNTIME_CRM_RESULTS_TOKEN",
                     "INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN"):
            os.environ.pop(name, None)
