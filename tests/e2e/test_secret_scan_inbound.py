"""Seed 13's secret scan on the inbound side (issue 21 item 6): no webhook signing secret
(newest or previous), subscription cleanup token, operator password, session cookie or
session secret, S2S private key or minted token, token key, Runtime token, or raw webhook
body appears in the replica's logs, ``/metrics``, any admin route or error, any ``/v1/``
response or error, the ingress's error answers, or the CLI's output.

Real OS processes on every backend: one ``integrationd run`` replica with the ingress
listener, an ``auth = "s2s"`` Outreach binding and a webhook route with a public URL; the
Outreach simulator (with the S2S token endpoint mounted) in this process. The replica's
subscription reconciler creates the route's subscriptions (the simulator hands a cleanup
token out with each), the simulator then delivers signed webhooks to the replica, an
operator signs in, and the scan reads everything the run showed or wrote.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import httpx
import pytest
import trio

from sandbox.outreach_sim import OutreachSimulator
from sandbox.ports import free_port
from sandbox.s2s_token_sim import S2STokenEndpoint, s2s_routes
from storage.ingress.receipts import ReceiptQuery
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.processes import cli_env, run_cli, start_replica, stop_all, write_config
from tests.support.s2s import private_pem, public_pem
from tests.support.secret_scan import (
    admin_app,
    api_app,
    get_routes,
    leaks,
    post_routes,
    session_cookies,
    signed_in,
)
from tests.ui.support import _FAST, PASSWORDS

pytestmark = pytest.mark.slow

APP_ID = "scan-s2s-app"
INSTALL = "scan-install"
WEBHOOK_SECRET = "whsec-new-" + os.urandom(12).hex()
PREVIOUS_SECRET = "whsec-old-" + os.urandom(12).hex()
SESSION_SECRET = "session-" + os.urandom(24).hex()
RUNTIME_TOKEN = "runtime-" + os.urandom(12).hex()
RESULTS_TOKEN = "results-" + os.urandom(12).hex()
TOKEN_KEY = os.urandom(32)


def _config(tmp_path: Path, db_url: str, sim_url: str, ingress_port: int,
            api_port: int) -> Path:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    files = {"webhook.secret": WEBHOOK_SECRET, "webhook-previous.secret": PREVIOUS_SECRET,
             "session.secret": SESSION_SECRET, "runtime.token": RUNTIME_TOKEN,
             "results.token": RESULTS_TOKEN, "app.pem": private_pem().decode(),
             "k1.key": TOKEN_KEY.hex()}
    for name, text in files.items():
        (secrets / name).write_text(text + "\n")
    operators = "".join(
        f'\n[[operators]]\nname = "{name}"\nrole = "{role}"\n'
        f'password_hash = "{_FAST.hash(PASSWORDS[name])}"\n'
        for name, role in (("viv", "viewer"), ("ada", "admin")))
    extra = f"""
[keys]
active = "k1"
dir = "{secrets}"

[api]
listen = "127.0.0.1:{api_port}"

[ingress]
listen = "127.0.0.1:{ingress_port}"
spool_dir = "{tmp_path / 'spool'}"
materialize_interval = 0.05
forward_interval = 0.2

[[runtimes]]
name = "crm"
org_id = "org-scan"
app_installation_id = "install-scan"
runtime_capability_id = "cap.leads"
runtime_work_binding_digest = "sha256:scan"
results_url = "http://127.0.0.1:1/runtime/v1/results"
token_file = "{secrets / 'runtime.token'}"
results_token_file = "{secrets / 'results.token'}"

[[bindings]]
binding_id = "outreach-main"
provider = "outreach"
org_id = "org-scan"
app_installation_id = "install-scan"
remote_account_id = "acct-scan"
base_url = "{sim_url}"
timeout = 5.0
auth = "s2s"
token_url = "{sim_url}/api/app/installs/{{installation_id}}/actions/accessToken"
s2s_app_id = "{APP_ID}"
s2s_installation_id = "{INSTALL}"
s2s_private_key_file = "{secrets / 'app.pem'}"

[[webhook_routes]]
route = "outreach-main"
binding_id = "outreach-main"
webhook = "outreach.prospect_events"
public_url = "http://127.0.0.1:{ingress_port}/hooks/outreach-main"
secret_file = "{secrets / 'webhook.secret'}"
previous_secret_file = "{secrets / 'webhook-previous.secret'}"
secret_generation = 2
{operators}"""
    cfg = write_config(tmp_path / "scan.toml", db_url, extra=extra,
                       replica_extra="", admin_listen="127.0.0.1:0")
    text = cfg.read_text().replace('[admin]\nlisten = "127.0.0.1:0"\n',
                                   '[admin]\nlisten = "127.0.0.1:0"\nsession_secret_file = "'
                                   f'{secrets / "session.secret"}"\n')
    cfg.write_text(text)
    published = run_cli(cfg, "catalog", "publish", "--actor", "ada", "--reason", "scan")
    assert published.returncode == 0, published.stderr
    return cfg


async def test_no_inbound_secret_or_raw_body_appears_in_logs_metrics_console_api_or_cli(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        nursery: trio.Nursery) -> None:
    s2s = S2STokenEndpoint(app_id=APP_ID, public_key_pem=public_pem(private_pem()),
                           installs={INSTALL})
    sim = OutreachSimulator(tokens=s2s.access_tokens, mounts=s2s_routes(s2s))
    sim_url = f"http://127.0.0.1:{await nursery.start(sim.run)}"
    ingress_port, api_port = free_port(), free_port()
    cfg = _config(tmp_path, database.url, sim_url, ingress_port, api_port)
    sources: list[tuple[str, str]] = []
    replica = await start_replica(cfg, "scan", keep_stdout=True)
    try:
        # The replica's reconciler subscribes the route (minted token, cleanup tokens).
        async def subscribed() -> bool:
            return sorted(s.action for s in sim.subscriptions()) == [
                "created", "destroyed", "updated"]

        await wait_for(subscribed, within_s=60)
        assert all(s.secret == WEBHOOK_SECRET for s in sim.subscriptions())
        # The simulator delivers signed webhooks to the replica's ingress.
        prospect = sim.put_prospect({"firstName": "Ada", "title": "Engineer"}, notify=True)
        sim.update_prospect(prospect.id, {"title": "CTO"})
        await sim.wait_deliveries_settled()

        async def received() -> bool:
            return len(await store.ingress_receipt_list(ReceiptQuery(limit=10))) >= 2

        await wait_for(received, within_s=30)
        bodies = [r.body for r in await store.ingress_receipt_list(ReceiptQuery(limit=50))]

        async with httpx.AsyncClient(timeout=20) as http:
            # The ingress's refusals: a body signed with the wrong secret, and one naming
            # a secret in its text.
            hooks = f"http://127.0.0.1:{ingress_port}/hooks/outreach-main"
            for body, signature in ((bodies[0], "00" * 32),
                                    (json.dumps({"secret": WEBHOOK_SECRET}).encode(),
                                     PREVIOUS_SECRET)):
                r = await http.post(hooks, content=body, headers={
                    "content-type": "application/vnd.api+json",
                    "Outreach-Webhook-Signature": signature})
                assert r.status_code == 401, r.text
                sources.append((f"ingress error {r.status_code}", r.text
                                + json.dumps(dict(r.headers))))
            # The service API: every GET route (enumerated from the app itself) and
            # every POST route's errors: a webhook secret or the session secret presented
            # as a bearer token, a malformed body, a body naming a secret.
            api = f"http://127.0.0.1:{api_port}"
            v1 = await api_app(cfg, store)
            v1_gets = get_routes(v1, {})
            v1_posts = post_routes(v1)
            assert "/v1/commands" in v1_posts and len(v1_gets) >= 2, (v1_gets, v1_posts)
            for path in v1_gets:
                r = await http.get(f"{api}{path}",
                                   headers={"Authorization": f"Bearer {RUNTIME_TOKEN}"})
                assert r.status_code < 500, (path, r.status_code)
                sources.append((f"GET {path} ({r.status_code})", r.text
                                + json.dumps(dict(r.headers))))
            for path in v1_posts:
                for token, body in ((WEBHOOK_SECRET, b"{}"), (SESSION_SECRET, b"{}"),
                                    (RUNTIME_TOKEN, b"{nope"),
                                    (RUNTIME_TOKEN, json.dumps(
                                        {"cleanup": PREVIOUS_SECRET}).encode())):
                    r = await http.post(f"{api}{path}", content=body, headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json"})
                    assert 400 <= r.status_code < 500, (path, r.status_code, r.text)
                    sources.append((f"error POST {path} ({r.status_code})", r.text))

        # Everything the console serves, signed in (a password and a session cookie).
        status, metrics = await replica.get("/metrics")
        assert status == 200
        sources.append(("/metrics", metrics.decode()))
        items = await store.work_list(WorkQuery(limit=500))
        receipts = await store.ingress_receipt_list(ReceiptQuery(limit=50))
        values = {"work_id": [i.work_id for i in items],
                  "receipt_id": [r.receipt_id for r in receipts],
                  "binding_id": ["outreach-main"], "route": ["outreach-main"],
                  "family": sorted({i.family for i in items})}
        app = await admin_app(cfg, store)
        routes = get_routes(app, values)
        client = await signed_in(replica.admin, "viv")
        try:
            statuses = {}
            for path in routes:
                r = await client.get(path)
                statuses[path] = r.status_code
                sources.append((f"GET {path}", r.text + json.dumps(dict(r.headers))))
            assert not {p: s for p, s in statuses.items() if s >= 500}
            assert statuses["/admin/api/subscriptions"] == 200
            assert len(sources[-1][1]) > 0
            wrong = await client.post("/admin/sign-in", data={
                "name": "ada", "password": PASSWORDS["viv"], "csrf_token": "x"})
            sources.append(("error POST sign-in", wrong.text))
            cookies = session_cookies(client)
            assert cookies, "signed in: a session cookie"
        finally:
            await client.aclose()
        # Every admin POST route's errors: a viewer (not authorized) and an admin with a
        # wrong CSRF token (nothing is performed), each form naming secrets.
        admin_posts = [p for p in post_routes(app) if p != "/admin/sign-in"]
        assert len(admin_posts) >= 5, admin_posts
        form = {"csrf_token": WEBHOOK_SECRET, "reason": PREVIOUS_SECRET,
                "password": PASSWORDS["ada"], "secret": SESSION_SECRET}
        for name in ("viv", "ada"):
            poster = await signed_in(replica.admin, name)
            cookies |= {f"{label} of {name}": v for label, v in session_cookies(poster).items()}
            try:
                for path in admin_posts:
                    r = await poster.post(path, data=form)
                    assert 400 <= r.status_code < 500, (name, path, r.status_code, r.text)
                    sources.append((f"error POST {path} as {name} ({r.status_code})",
                                    r.text + json.dumps(dict(r.headers))))
            finally:
                await poster.aclose()

        # The CLI: subscriptions, work, ingress, audit and the DLQ.
        listings: list[tuple[str, ...]] = [
            ("subscriptions", "status"), ("subscriptions", "status", "--json"),
            ("work", "list"), ("work", "list", "--json"), ("dlq", "list"),
            ("audit", "list", "--json"), ("binding", "list"), ("check-config",),
            *(("work", "show", i.work_id, "--json") for i in items)]
        for argv in listings:
            done = run_cli(cfg, *argv, env=cli_env())
            assert done.returncode == 0, (argv, done.stderr)
            sources.append((" ".join(argv), done.stdout + done.stderr))
    finally:
        replica.terminate()
        await replica.wait()
        await stop_all([replica])
    sources.append(("replica stderr", replica.log.read_text(errors="replace")))
    sources.append(("replica stdout", (tmp_path / "scan.out").read_text(errors="replace")))
    assert any('"subscription_created"' in text for _, text in sources[-2:])

    secrets = {"webhook signing secret": WEBHOOK_SECRET,
               "previous webhook signing secret": PREVIOUS_SECRET,
               "session secret": SESSION_SECRET, "runtime token": RUNTIME_TOKEN,
               "results token": RESULTS_TOKEN, "token key (hex)": TOKEN_KEY.hex(),
               "token key (base64)": base64.b64encode(TOKEN_KEY).decode(),
               "S2S private key": max(private_pem().decode().splitlines(), key=len),
               **{f"operator password {n}": p for n, p in PASSWORDS.items()},
               **cookies}
    secrets |= {f"cleanup token of subscription {s.id}": s.cleanup_token
                for s in sim.subscriptions()}
    secrets |= {f"minted S2S token {i}": t for i, t in enumerate(s2s.access_tokens)}
    for i, body in enumerate(bodies):
        secrets[f"raw webhook body {i}"] = body.decode()
        secrets[f"raw webhook body {i} (base64)"] = base64.b64encode(body).decode()
    assert len(s2s.access_tokens) >= 1 and len(bodies) >= 2
    assert len(sources) > 40
    assert leaks(secrets, sources) == []
