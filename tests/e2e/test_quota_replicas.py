"""Seed 13's quota row through dispatch: four real ``integrationd run`` processes on one
database hammer one quota key while 100 independent keys run beside it, all sent to the
HubSpot simulator. The keys are a per-user dimension (``scope = "binding"``, like
Outreach's per-user hour; limit 4 per 2 s, a burst of 2, sliding): one user's binding is
the hot key (16 commands), 100 other users' bindings are 100 cold keys (one command
each). The test counts the simulator's arrivals in every window of the provider's own
length, per key, and fails on any excess (replica scaling does not multiply quota), and
checks that the hot key never held the cold ones back: no cold command waited for quota,
and every cold send arrived before the hot backlog was done, although the hot commands
were queued first. SQLite and MariaDB (and Galera where the storage suite runs it: the
replicas are then on two nodes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from daemon.core.canonical import canonical_digest
from daemon.core.handoff import EffectHandoffKey
from daemon.core.token_bundle import TokenKey
from sandbox.ports import free_port
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.e2e.test_effect_faults import World, world
from tests.support.backends import FreshDatabase
from tests.support.commands import command_doc
from tests.support.harness import wait_for
from tests.support.l1 import write_sandbox_definitions
from tests.support.processes import start_replica, stop_all
from tests.support.slice import LINK_SCOPE, RUNTIME_TOKEN, SCOPE

pytestmark = pytest.mark.slow

LIMIT, WINDOW_S = 4, 2.0
# A loaded shared machine can take longer than the default 250 ms between "send starts"
# and "the provider has read it": the jitter covers that spread (and costs throughput).
PER_USER = (f'[quota.per_user]\nlimit = {LIMIT}\nwindow = {WINDOW_S}\nscope = "binding"\n'
            'kind = "sliding"\nburst = 2\njitter = 1.0\n\n')
HOT_COMMANDS, COLD_KEYS = 16, 100
KEY = TokenKey("k1", bytes(range(32)))
AUTH = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}


def _worst_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    worst, j = 0, 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] < start + window_s:
            j += 1
        worst = max(worst, j - i)
    return worst


def _definitions(tmp_path: Path) -> str:
    """The sandbox L1 with only the per-user dimension: the shipped HubSpot dimensions
    count per app installation, which all these users share (they would make the 101
    keys one), so every ``[quota.*]`` table goes."""
    directory = write_sandbox_definitions(tmp_path / "l1")
    hubspot = directory / "hubspot.toml"
    kept: list[str] = []
    dropping = False
    for line in hubspot.read_text().splitlines(keepends=True):
        if line.startswith("["):
            dropping = line.startswith("[quota.")
        if not dropping:
            kept.append(line)
    text = "".join(kept)
    tables = [line for line in kept if line.startswith("[")]
    assert tables and not any(t.startswith("[quota.") for t in tables)
    # Top-level keys go before the first table.
    head, sep, rest = text.partition("[auth.bearer]")
    hubspot.write_text(head + PER_USER + sep + rest)
    return str(directory)


def _with_grants(w: World, tmp_path: Path) -> None:
    """The shared binding authenticates with grants, so per-user bindings can exist (no
    token here is ever refreshed: they are valid for an hour)."""
    os.environ.pop("INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN")  # world() set it
    (tmp_path / "k1.key").write_text(KEY.material.hex())
    (tmp_path / "client.secret").write_text("unused\n")
    text = w.config.read_text()
    assert 'auth = "static_token"\n' in text
    text = text.replace('auth = "static_token"\n', (
        'auth = "grant"\ntoken_url = "http://127.0.0.1:9/oauth/token"\n'
        f'client_id = "client-1"\nclient_secret_file = "{tmp_path / "client.secret"}"\n'))
    w.config.write_text(text + f'\n[keys]\ndir = "{tmp_path}"\nactive = "k1"\n')


async def _connect(w: World, user: str) -> None:
    token = f"access-SECRET-{user}"
    w.sim.tokens.add(token)
    r = await w.http.post(
        f"http://127.0.0.1:{w.api_port}/v1/bindings/{user}-hubspot/connect", headers=AUTH,
        json={"idempotency_key": f"connect-{user}", "kind": "per_user", "user_id": user,
              "provider": "hubspot",
              "identity": {"issuer": "https://auth.example", "remote_account_id": "portal-1",
                           "remote_subject": f"subject-{user}"},
              "grant": {"type": "oauth_code_exchange", "access_token": token,
                        "expires_in": 3600}})
    assert r.status_code == 200, r.text


def _command(intent_id: str, lead: str, user: str) -> dict[str, Any]:
    command = {**command_doc(intent_id, "CTO", lead=lead), "user_id": user}
    return {"effect_handoff_key": EffectHandoffKey(SCOPE, intent_id).encode(),
            "payload_digest": canonical_digest(command), "runtime_outbox_id": f"ob-{intent_id}",
            "command": command}


async def test_four_replicas_hammering_one_quota_key_never_exceed_it_beside_100_cold_keys(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with world(database, tmp_path, definitions_dir=_definitions(tmp_path)) as w:
        _with_grants(w, tmp_path)
        hot = [(f"hot-{i}", str(1000 + i), "hot") for i in range(HOT_COMMANDS)]
        cold = [(f"cold-{k}", str(2000 + k), f"u{k:03d}") for k in range(COLD_KEYS)]
        now = time.time_ns() // 1000
        for lead, contact, _ in [*hot, *cold]:
            w.sim.add_contact(contact, jobtitle="Engineer")
            await store.link_adopt(LINK_SCOPE, "lead", lead, "contact", contact,
                                   actor="test", role="admin", reason="setup", now_us=now)
        started = [await start_replica(w.config, "a")]
        try:
            for user in ["hot", *(u for _, _, u in cold)]:
                await _connect(w, user)
            for name in ("b", "c", "d"):
                cfg = tmp_path / f"{name}.toml"
                cfg.write_text(w.config.read_text()
                               .replace(f"127.0.0.1:{w.api_port}", f"127.0.0.1:{free_port()}")
                               .replace(f'url = "{w.url}"', f'url = "{w.second_url}"'))
                started.append(await start_replica(cfg, name))
            # Every replica is up and claiming before the backlog arrives: the hot key's
            # commands first, the cold keys' behind them.
            await trio.sleep(1.0)
            for batch in (hot, cold):
                r = await w.http.post(
                    f"http://127.0.0.1:{w.api_port}/v1/commands/batch", headers=AUTH,
                    json={"commands": [_command(f"int-{lead}", lead, user)
                                       for lead, _, user in batch]})
                assert r.status_code == 200, r.text
                assert {x["status"] for x in r.json()["results"]} == {200}, r.text

            async def all_done() -> bool:
                items = await store.work_list(WorkQuery(family="external_effect", limit=500))
                return len(items) == HOT_COMMANDS + COLD_KEYS and all(
                    i.state.value == "succeeded" for i in items)

            await wait_for(all_done, within_s=180)
        finally:
            await stop_all(started)
        user_of = {contact: user for _, contact, user in [*hot, *cold]}
        patches = [rec for rec in w.sim.requests if rec.method == "PATCH"]
        assert len(patches) == HOT_COMMANDS + COLD_KEYS
        assert {rec.status for rec in patches} == {200}
        arrivals: dict[str, list[float]] = {}
        for rec in patches:
            arrivals.setdefault(user_of[str(rec.contact_id)], []).append(rec.received_at)
        assert len(arrivals["hot"]) == HOT_COMMANDS and len(arrivals) == 1 + COLD_KEYS
        # The provider's own definition, per key: any 2 s window sees at most 4 arrivals.
        worst = {user: _worst_window(times, WINDOW_S) for user, times in arrivals.items()}
        assert max(worst.values()) <= LIMIT, worst
        # The test means something: the backlog ran the hot key at its limit.
        assert worst["hot"] >= 3, worst
        # The cold keys were never held back by the hot one: not one cold command waited
        # for quota (each ran on its first claim), the hot ones did, and every cold send
        # arrived before the hot backlog was done, although it was queued behind it.
        items = await store.work_list(WorkQuery(family="external_effect", limit=500))
        bindings = {}
        for item in items:
            command = await store.command_get(item.subject_id)
            assert command is not None
            bindings[item.work_id] = command.binding_id
        executions = {i.work_id: await store.work_executions(i.work_id) for i in items}
        cold_items = [w_id for w_id, b in bindings.items() if b != "hot-hubspot"]
        hot_items = [w_id for w_id, b in bindings.items() if b == "hot-hubspot"]
        assert (len(cold_items), len(hot_items)) == (COLD_KEYS, HOT_COMMANDS)
        held = {w_id: executions[w_id] for w_id in cold_items
                if [e.outcome for e in executions[w_id]] != ["succeeded"]}
        assert held == {}
        assert any(e.reason == "quota_wait" for w_id in hot_items
                   for e in executions[w_id]), "the hot key never made anything wait"
        cold_times = [t for user, times in arrivals.items() if user != "hot" for t in times]
        assert max(cold_times) < max(arrivals["hot"])
        # More than one replica dispatched (otherwise this is a one-replica test).
        owners = {e.replica for runs in executions.values() for e in runs
                  if e.outcome == "succeeded"}
        assert len(owners) >= 2, owners
