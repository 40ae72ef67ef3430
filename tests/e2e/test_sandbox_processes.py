"""``make run``'s pieces as real processes with config/example.toml (only its ports and
database changed): ``python -m sandbox`` starts the Outreach simulator, links its
Prospects to the sandbox Leads and subscribes the replica's ``outreach-main`` route; its
live Prospect changes arrive at ``integrationd run`` as signed webhooks, are materialized
into ``inbound_apply`` work and change the Lead's inbound-owned fields in the Runtime.
The other way, the sandbox Runtime's title changes go out as HubSpot contact PATCHes and
as Outreach Prospect PATCHes (the outbound-owned title), each receipted to the Runtime."""

from __future__ import annotations

import functools
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import argon2
import httpx
import trio

from daemon.core.identity import integration_scope_digest
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from sandbox.demo import _lead_fields
from sandbox.demo_keys import private_pem
from sandbox.ports import free_port
from storage.effect_values import LinkState
from storage.ingress.receipts import ReceiptQuery
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.attempts import sent_attempts
from tests.support.backends import FreshDatabase
from tests.support.processes import REPO, ReplicaProcess, cli_env, run_cli, start_replica

EXAMPLE = REPO / "config" / "example.toml"
LEADS = 3
# The example's listeners and simulators (admin, api, ingress, Runtime, HubSpot, Outreach).
PORTS = (8780, 8781, 8782, 8790, 8791, 8793)


def _example_config(tmp_path: Path, url: str) -> Path:
    """config/example.toml with free ports and the test's database; the files it names
    under var/ made as the Makefile makes them (relative to the working directory)."""
    text = EXAMPLE.read_text()
    for port in PORTS:
        assert f"127.0.0.1:{port}" in text, port
        text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}")
    text, replaced = re.subn(r'(?m)^url = "sqlite:///var/integrationd.db"$',
                             f'url = "{url}"', text)
    assert replaced == 1
    var = tmp_path / "var" / "secrets"
    var.mkdir(parents=True)
    for name in re.findall(r'"var/secrets/([a-z-]+\.token)"', text):
        (var / name).write_text(secrets.token_urlsafe(32) + "\n")
    assert '"var/secrets/admin-session.secret"' in text
    (var / "admin-session.secret").write_text(secrets.token_urlsafe(48) + "\n")
    # [keys] active = "sandbox" and the Outreach S2S app's key, as the Makefile makes them.
    assert 'active = "sandbox"' in text and '"var/secrets/outreach-app.pem"' in text
    (var / "sandbox.key").write_text(secrets.token_hex(32) + "\n")
    (var / "outreach-app.pem").write_bytes(private_pem())
    for who in ("admin", "viewer"):
        (var / f"{who}.password-hash").write_text(
            argon2.PasswordHasher().hash(secrets.token_urlsafe(12)) + "\n")
    cfg = tmp_path / "example.toml"
    cfg.write_text(text)
    return cfg


def _setting(cfg: Path, pattern: str) -> str:
    found = re.search(pattern, cfg.read_text())
    assert found is not None, pattern
    return found.group(1)


async def _start_sandbox(cfg: Path) -> ReplicaProcess:
    log = cfg.parent / "sandbox.log"
    with log.open("wb") as handle:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "sandbox", "--config", str(cfg),
             "--leads", str(LEADS), "--interval", "0.5", "--inbound-interval", "0.3"],
            stdout=subprocess.DEVNULL, stderr=handle, cwd=str(cfg.parent), env=cli_env())
    return ReplicaProcess(proc, log)


async def _found(read: Callable[[str], Awaitable[object]], operation: str) -> bool:
    return await read(operation) is not None


async def _eventually(what: str, predicate: Callable[[], Awaitable[bool]],
                      within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await trio.sleep(0.2)
    raise AssertionError(f"not reached: {what}")


async def test_make_run_sends_live_signed_outreach_webhooks_that_reach_the_lead(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    cfg = _example_config(tmp_path, database.url)
    for args in (("migrate",), ("catalog", "publish", "--actor", "admin", "--reason", "e2e"),
                 ("reconcile", "start", "--binding", "outreach-main", "--resource",
                  "prospect", "--actor", "admin", "--reason", "e2e")):  # as make run does
        done = run_cli(cfg, *args)
        assert done.returncode == 0, done.stderr
    runtime = "http://" + _setting(cfg, r'results_url = "http://([^/"]+)/')
    processes: list[ReplicaProcess] = []
    try:
        sandbox = await _start_sandbox(cfg)
        processes.append(sandbox)
        subscribed = await sandbox.wait_event("sandbox_outreach_subscribed", within_s=60)
        assert subscribed["route"] == "outreach-main"
        assert subscribed["url"].endswith("/hooks/outreach-main")
        # The sandbox adopted one RemoteLink per Lead in the Outreach binding's scope.
        scope = integration_scope_digest("org-demo", "install-demo", "outreach",
                                         "outreach-demo")
        for i in range(1, LEADS + 1):
            link = await store.link_get(scope, "lead", f"lead-{i}")
            assert link is not None and link.state == LinkState.ACTIVE
            assert link.remote_id == str(i)
        processes.append(await start_replica(cfg, "replica"))

        async def materialized() -> bool:
            receipts = await store.ingress_receipt_list(ReceiptQuery(limit=50))
            return any(r.state == "materialized" and r.route == "outreach-main"
                       for r in receipts)

        async def applied() -> bool:
            items = await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY, limit=50))
            return any(i.state.value == "succeeded" for i in items)

        async def minted() -> bool:
            # The example's Outreach binding is auth = "s2s": reconciliation's list
            # request minted its token at the simulator's endpoint (version 1 is the
            # generation's placeholder).
            grant = await store.grant_get("outreach-main", 1)
            return grant is not None and grant.token_version >= 2

        await _eventually("the S2S binding minted its token", minted)
        await _eventually("a webhook receipt materialized", materialized)
        await _eventually("an inbound_apply item succeeded", applied)

        async with httpx.AsyncClient(base_url=runtime, timeout=10) as http:
            async def lead_changed_in_runtime() -> bool:
                stats: dict[str, Any] = (await http.get("/_runtime/stats")).json()
                if stats.get("mutations_applied", 0) < 1:
                    return False
                for i in range(1, LEADS + 1):
                    fields = (await http.get(f"/_runtime/leads/lead-{i}/fields")).json()
                    seeded = _lead_fields(i)
                    # Only the inbound Flow changes these fields (nothing else writes them).
                    if any(fields["fields"].get(k) != seeded[k]
                           for k in ("FirstName", "LastName", "Company")):
                        return True
                return False

            await _eventually("an inbound mutation applied on the Runtime's Lead",
                              lead_changed_in_runtime)

            # Outbound: each title change is a HubSpot PATCH and an Outreach PATCH.
            async def committed(operation: str) -> dict[str, Any] | None:
                intents = (await http.get("/_runtime/intents",
                                          params={"status": "COMMITTED"})).json()["intents"]
                found = [i for i in intents if i["operation"] == operation]
                return found[0] if found else None

            for operation in ("hubspot.contact.update_jobtitle",
                              "outreach.prospect.update_title"):
                await _eventually(f"a committed {operation} intent",
                                  functools.partial(_found, committed, operation))
            outreach = await committed("outreach.prospect.update_title")
            assert outreach is not None
        command = await store.command_get(outreach["command_id"])
        assert command is not None and command.binding_id == "outreach-main"
        (attempt,) = sent_attempts(await store.effect_attempts(outreach["command_id"]))
        lead_number = outreach["lead_id"].removeprefix("lead-")
        assert (attempt.outcome, attempt.method, attempt.target_path) == (
            "ACCEPTED", "PATCH", f"/api/v2/prospects/{lead_number}")
        base = "http://" + _setting(cfg, r'(?s)binding_id = "outreach-main".*?base_url = '
                                         r'"http://([^"]+)"')
        async with httpx.AsyncClient(base_url=base, timeout=10) as osim:
            prospect = (await osim.get(f"/_sim/prospects/{lead_number}")).json()
        async with httpx.AsyncClient(base_url=runtime, timeout=10) as http:
            intents = (await http.get("/_runtime/intents")).json()["intents"]
        # The Prospect's title is one the Runtime sent it (the latest PATCH's).
        sent = {i["value"] for i in intents if i["lead_id"] == outreach["lead_id"]
                and i["operation"] == "outreach.prospect.update_title"}
        assert prospect["attributes"]["title"] in sent
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
