"""The reference Runtime runs the connect flows and sends ``command.user_id`` (issue 9
item 1), with real processes: a replica (``integrationd run``), the reference Runtime
(``python -m sandbox.runtime``) and the HubSpot simulator, all on loopback.

* The Runtime connects ada's own HubSpot grant through ``/v1/bindings/.../connect`` and
  records the binding and generation integrationd answers; a title change of a Lead ada
  owns carries ``user_id`` and reaches the provider with ada's token (the simulator
  accepts no other).
* The Runtime reconnects ada (generation 2) while a command of hers is queued behind
  one in flight: the queued command never reaches the provider, and the Runtime gets a
  true terminal (no-effect) receipt for it.
* A Lead owned by bob, who never connected, gets the durable ``no_user_binding``
  rejection: counted by the Runtime, never resent.
* Someone else moves ada's generation: the Runtime's next flow is ``stale_generation``,
  counted, not resent; it reads the binding again and the user's next try succeeds.

No token appears in either process's log, in the Runtime's views or its stats.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from argon2 import PasswordHasher

from daemon.core.states import WorkState
from daemon.core.token_bundle import TokenKey
from daemon.services.clock import WallClock
from sandbox.hubspot_sim import Fault, HubSpotSimulator
from sandbox.ports import free_port
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.l1 import sandbox_definitions_dir
from tests.support.processes import ReplicaProcess, cli_env, run_cli, start_replica
from tests.support.slice import LINK_SCOPE, RESULTS_TOKEN, RUNTIME_TOKEN, SCOPE

pytestmark = pytest.mark.slow

KEY = TokenKey("k1", bytes(range(32)))
ADA_TOKEN = "access-SECRET-ada-1"
ADA_TOKEN_2 = "access-SECRET-ada-2"
ADA_REFRESH = "refresh-SECRET-ada"
OTHER_TOKEN = "access-SECRET-ada-3"
CLIENT_SECRET = "client-SECRET-unused"
ADA_BINDING = "user.ada.hubspot"
IDENTITY = {"issuer": "https://auth.example", "remote_account_id": "portal-1",
            "remote_subject": "user-ada"}
SECRETS = (ADA_TOKEN, ADA_TOKEN_2, ADA_REFRESH, OTHER_TOKEN, RUNTIME_TOKEN, RESULTS_TOKEN,
           CLIENT_SECRET)


def _config(tmp: Path, db_url: str, *, api_port: int, runtime_port: int,
            hubspot_port: int) -> Path:
    secrets = tmp / "secrets"
    secrets.mkdir()
    (secrets / "k1.key").write_text(KEY.material.hex())
    for name, value in (("runtime.token", RUNTIME_TOKEN), ("results.token", RESULTS_TOKEN),
                        ("client.secret", CLIENT_SECRET)):
        (secrets / name).write_text(value + "\n")
    path = tmp / "replica.toml"
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
definitions_dir = "{sandbox_definitions_dir()}"
[keys]
active = "k1"
dir = "{secrets}"
[families.external_effect]
lease_ttl = 20.0
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
results_url = "http://127.0.0.1:{runtime_port}/runtime/v1/results"
token_file = "{secrets}/runtime.token"
results_token_file = "{secrets}/results.token"
[[bindings]]
binding_id = "hubspot-main"
provider = "hubspot"
org_id = "{SCOPE.org_id}"
app_installation_id = "{SCOPE.app_installation_id}"
remote_account_id = "portal-1"
base_url = "http://127.0.0.1:{hubspot_port}"
timeout = 15.0
# Per-user principals need grants; the shared principal has none (nothing here uses it,
# and its token endpoint does not answer).
auth = "grant"
token_url = "http://127.0.0.1:9/oauth/token"
client_id = "client-1"
client_secret_file = "{secrets}/client.secret"
[[operators]]
name = "admin"
role = "admin"
password_hash = "{PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1).hash("pw")}"
""")
    return path


async def _start_runtime(tmp: Path, *, port: int, api_port: int) -> ReplicaProcess:
    """``python -m sandbox.runtime`` bound to the replica's /v1 API (tokens by env)."""
    env = {**cli_env(), "SANDBOX_RUNTIME_INTEGRATION_TOKEN": RUNTIME_TOKEN,
           "SANDBOX_RUNTIME_RESULTS_TOKEN": RESULTS_TOKEN}
    log = tmp / "runtime.log"
    with log.open("wb") as handle:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "sandbox.runtime", "--port", str(port),
             "--integration-url", f"http://127.0.0.1:{api_port}",
             "--org-id", SCOPE.org_id, "--app-installation-id", SCOPE.app_installation_id,
             "--runtime-capability-id", SCOPE.runtime_capability_id,
             "--runtime-work-binding-digest", SCOPE.runtime_work_binding_digest,
             "--poll-interval", "0.1", "--retry-cap", "1"],
            stdout=subprocess.DEVNULL, stderr=handle, cwd=str(tmp), env=env)
    runtime = ReplicaProcess(proc, log)
    await runtime.wait_event("runtime_listening", within_s=30)
    return runtime


def _grant(token: str, **extra: Any) -> dict[str, Any]:
    return {"type": "oauth_code_exchange", "access_token": token, "expires_in": 3600,
            **extra}


async def _intent(http: httpx.AsyncClient, lead_id: str, intent_id: str) -> dict[str, Any]:
    doc = (await http.get(f"/leads/{lead_id}")).json()
    (intent,) = [i for i in doc["intents"] if i["intent_id"] == intent_id]
    return dict(intent)


async def _wait_intent(http: httpx.AsyncClient, lead_id: str, intent_id: str,
                       status: str, within_s: float = 60.0) -> dict[str, Any]:
    async def reached() -> bool:
        return bool((await _intent(http, lead_id, intent_id))["status"] == status)

    try:
        await wait_for(reached, within_s=within_s)
    except trio.TooSlowError:
        got = await _intent(http, lead_id, intent_id)
        raise AssertionError(f"intent {intent_id} never {status}: {got}") from None
    return await _intent(http, lead_id, intent_id)


async def _title(http: httpx.AsyncClient, lead_id: str, title: str) -> str:
    r = await http.patch(f"/leads/{lead_id}", json={"title": title})
    assert r.status_code == 200, r.text
    return str(r.json()["intent_id"])


async def test_the_runtime_connects_users_and_its_commands_run_under_their_grants(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    api_port, runtime_port = free_port(), free_port()
    sim = HubSpotSimulator(tokens={ADA_TOKEN})  # only ada's token works, at first
    processes: list[ReplicaProcess] = []
    async with trio.open_nursery() as nursery:
        hubspot_port = await nursery.start(sim.run, "127.0.0.1", 0)
        cfg = _config(tmp_path, database.url, api_port=api_port,
                      runtime_port=runtime_port, hubspot_port=hubspot_port)
        for args in (("migrate",), ("catalog", "publish", "--actor", "admin", "--reason",
                                    "e2e")):
            done = run_cli(cfg, *args)
            assert done.returncode == 0, done.stderr
        try:
            processes.append(await _start_runtime(tmp_path, port=runtime_port,
                                                  api_port=api_port))
            processes.append(await start_replica(cfg, "replica"))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{runtime_port}",
                                         timeout=30) as http:
                await _scenario(http, sim, store, api_port)
            logs = "".join(p.log.read_text(errors="replace") for p in processes)
            assert "runtime_flow_applied" in logs and "binding_flow" in logs
            for secret in SECRETS:
                assert secret not in logs, "a token reached a log"
        finally:
            for p in processes:
                if p.proc.returncode is None:
                    p.terminate()
            for p in processes:
                try:
                    await p.wait(within_s=30)
                except trio.TooSlowError:
                    p.kill()
                    await p.wait()
            nursery.cancel_scope.cancel()


async def _lead(http: httpx.AsyncClient, sim: HubSpotSimulator, store: WorkStore,
                lead_id: str, contact_id: str, owner: str) -> None:
    sim.add_contact(contact_id, jobtitle="Engineer", email=f"{lead_id}@example.com")
    r = await http.post("/leads", json={"lead_id": lead_id, "title": "Engineer",
                                        "owner": owner})
    assert r.status_code == 201, r.text
    assert r.json()["owner"] == owner
    await store.link_adopt(LINK_SCOPE, "lead", lead_id, "contact", contact_id,
                           actor="test", role="admin", reason="e2e setup",
                           now_us=WallClock().now_us())


async def _scenario(http: httpx.AsyncClient, sim: HubSpotSimulator, store: WorkStore,
                    api_port: int) -> None:
    for lead_id, contact_id, owner in (("lead-1", "101", "ada"), ("lead-2", "102", "ada"),
                                       ("lead-3", "103", "bob")):
        await _lead(http, sim, store, lead_id, contact_id, owner)

    # -- connect: the Runtime hands ada's grant over and records binding + generation.
    r = await http.post("/users/ada/grants/hubspot/connect", json={
        "identity": IDENTITY, "grant": _grant(ADA_TOKEN, refresh_token=ADA_REFRESH)})
    assert r.status_code == 200, r.text
    assert r.json()["grant"] == {"user_id": "ada", "provider": "hubspot",
                                 "binding_id": ADA_BINDING, "generation": 1,
                                 "state": "connected", "token_version": 1, "stale": False}
    facts = await store.binding_get(ADA_BINDING)
    assert facts is not None and (facts.kind.value, facts.user_id, facts.generation) == (
        "per_user", "ada", 1)
    again = await http.post("/users/ada/grants/hubspot/connect", json={
        "identity": IDENTITY, "grant": _grant(ADA_TOKEN)})
    assert again.status_code == 400 and "reconnect" in again.json()["message"]

    # -- a command for ada's Lead carries user_id and runs under her grant.
    first = await _title(http, "lead-1", "CTO")
    intent = await _wait_intent(http, "lead-1", first, "COMMITTED", within_s=5)
    assert intent["user_id"] == "ada"
    command = await store.command_get(intent["command_id"])
    assert command is not None
    assert (command.binding_id, command.binding_generation) == (ADA_BINDING, 1)
    # Only ada's token is valid at the provider: the PATCH applied, so it was hers.
    assert [(q.contact_id, q.applied) for q in sim.requests if q.method == "PATCH"] == [
        ("101", True)]
    (receipt,) = (await http.get("/leads/lead-1")).json()["receipts"]
    assert (receipt["result_format_version"], receipt["remote_id"]) == (1, "101")

    # -- reconnect while a command is queued: it is refused, with a true receipt.
    sim.tokens.add(ADA_TOKEN_2)  # the provider would take the new identity's token too
    sim.inject(Fault(mode="latency", method="PATCH", latency_ms=8000))
    in_flight = await _title(http, "lead-2", "Director")
    accepted = await _wait_intent(http, "lead-2", in_flight, "ACCEPTED")

    async def dispatched() -> bool:
        return bool(await store.effect_attempts(accepted["command_id"]))

    await wait_for(dispatched, within_s=30)  # the first is at the provider, under gen 1
    queued = await _title(http, "lead-2", "VP Engineering")
    queued_intent = await _wait_intent(http, "lead-2", queued, "ACCEPTED")
    r = await http.post("/users/ada/grants/hubspot/reconnect", json={
        "grant": _grant(ADA_TOKEN_2), "reason": "ada re-authorized"})
    assert r.status_code == 200, r.text
    assert (r.json()["grant"]["generation"], r.json()["grant"]["state"]) == (2, "connected")
    assert (await _intent(http, "lead-2", queued))["status"] == "ACCEPTED"  # still queued
    done = await _wait_intent(http, "lead-2", queued, "COMMITTED")
    (item,) = [i for i in await store.work_list(WorkQuery(family="external_effect"))
               if i.subject_id == queued_intent["command_id"]]
    assert (item.state, item.terminal_outcome, item.failure_class) == (
        WorkState.SUCCEEDED, "no_effect", "binding_generation")
    assert await store.effect_attempts(queued_intent["command_id"]) == []
    receipts = {x["intent_id"]: x for x in (await http.get("/leads/lead-2")).json()[
        "receipts"]}
    assert receipts[queued]["result_format_version"] == 2  # no effect, proven
    assert json.loads(receipts[queued]["canonical_result"])["outcome"] == "NO_EFFECT"
    assert done["command_id"] == queued_intent["command_id"]
    await _wait_intent(http, "lead-2", in_flight, "COMMITTED")
    # The provider saw the in-flight PATCH only: never the queued title.
    assert [q.contact_id for q in sim.requests if q.method == "PATCH"] == ["101", "102"]
    contact = sim.contact("102")
    assert contact is not None and contact["properties"]["jobtitle"] == "Director"

    # -- bob never connected: the durable no_user_binding rejection, counted, not resent.
    bobs = await _title(http, "lead-3", "CTO")
    rejected = await _wait_intent(http, "lead-3", bobs, "REJECTED")
    assert rejected["rejection_receipt"]["reason"] == "no_user_binding"
    assert rejected["in_outbox"] is False and rejected["user_id"] == "bob"
    stats = (await http.get("/_runtime/stats")).json()
    assert stats["no_user_binding"] == 1
    sent = stats["dispatch_sent"]
    await trio.sleep(0.5)
    assert (await http.get("/_runtime/stats")).json()["dispatch_sent"] == sent
    assert [q for q in sim.requests if q.contact_id == "103"] == []

    # -- someone else moves ada's generation: the Runtime's flow is stale, not resent.
    moved = await http.post(  # another client of the same Runtime account
        f"http://127.0.0.1:{api_port}/v1/bindings/{ADA_BINDING}/reconnect",
        headers={"Authorization": f"Bearer {RUNTIME_TOKEN}"},
        json={"idempotency_key": "elsewhere-1", "expected_generation": 2,
              "grant": _grant(OTHER_TOKEN)})
    assert moved.status_code == 200 and moved.json()["generation"] == 3, moved.text
    stale = await http.post("/users/ada/grants/hubspot/disconnect", json={})
    assert stale.status_code == 409, stale.text
    assert (stale.json()["error"], stale.json()["generation"]) == ("stale_generation", 3)
    stats = (await http.get("/_runtime/stats")).json()
    assert (stats["stale_generation"], stats["flows_refused"]) == (1, 1)
    facts = await store.binding_get(ADA_BINDING)
    assert facts is not None and (facts.generation, facts.state.value) == (3, "connected")
    # The Runtime read the binding again: the user's next try names generation 3.
    off = await http.post("/users/ada/grants/hubspot/disconnect", json={})
    assert off.status_code == 200, off.text
    assert (off.json()["grant"]["generation"], off.json()["grant"]["state"]) == (
        3, "disconnected")
    user = (await http.get("/users/ada")).json()
    assert user["leads"] == ["lead-1", "lead-2"]
    (grant,) = user["grants"]
    assert (grant["binding_id"], grant["generation"], grant["state"]) == (
        ADA_BINDING, 3, "disconnected")
    views = json.dumps([user, stats, (await http.get("/leads/lead-1")).json(),
                        (await http.get("/_runtime/intents")).json()])
    for secret in SECRETS:
        assert secret not in views
