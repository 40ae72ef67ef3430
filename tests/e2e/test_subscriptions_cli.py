"""``integrationd subscriptions reconcile|status``: the console's action from the CLI, real
processes, real databases: authorized, audited; bad input one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.backends import FreshDatabase
from tests.support.processes import cli_env, run_cli, write_config


def _config(tmp_path: Path, url: str) -> Path:
    return write_config(tmp_path / "a.toml", url, extra="""
[[operators]]
name = "otto"
role = "operator"

[[operators]]
name = "val"
role = "viewer"

[[bindings]]
binding_id = "outreach-main"
provider = "outreach"
org_id = "org-1"
app_installation_id = "install-1"
remote_account_id = "org-77"
base_url = "http://127.0.0.1:9"
auth = "static_token"

[[webhook_routes]]
route = "outreach-main"
binding_id = "outreach-main"
webhook = "outreach.prospect_events"
public_url = "https://hooks.example.test/hooks/outreach-main"
""")


def _env() -> dict[str, str]:
    env = cli_env()
    env["INTEGRATIOND_BINDING_OUTREACH_MAIN_TOKEN"] = "binding-token-never-shown"
    env["INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET"] = "webhook-secret-never-shown"
    return env


async def test_reconcile_is_authorized_and_audited_and_status_shows_no_secret(
        database: FreshDatabase, tmp_path: Path) -> None:
    cfg, env = _config(tmp_path, database.url), _env()
    viewer = run_cli(cfg, "subscriptions", "reconcile", "--binding", "outreach-main",
                     "--actor", "val", "--reason", "go", env=env)
    assert viewer.returncode == 1 and "may not subscriptions.reconcile" in viewer.stderr
    unknown = run_cli(cfg, "subscriptions", "reconcile", "--binding", "nope", "--actor",
                      "otto", "--reason", "go", env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("integrationd: --binding: binding 'nope' has no route")
    queued = run_cli(cfg, "subscriptions", "reconcile", "--binding", "outreach-main",
                     "--actor", "otto", "--reason", "after the outage", env=env)
    assert queued.returncode == 0, queued.stderr
    assert queued.stdout.startswith("binding outreach-main: queued a subscription"
                                    " reconciliation run as work item ")
    audit = run_cli(cfg, "audit", "list", "--json", env=env)
    entries = [e for e in json.loads(audit.stdout)["entries"]
               if e["action"] == "subscriptions.reconcile"]
    assert [(e["actor"], e["target_id"], e["reason"]) for e in entries] == [
        ("otto", "outreach-main", "after the outage")]
    status = run_cli(cfg, "subscriptions", "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    # Nothing observed yet: every desired subscription is missing; the queued run has
    # not run (it is no last run).
    assert (doc["subscriptions"], doc["runs"], doc["health"]) == (
        [], [], {"active": 0, "disabled": 0, "missing": 3})
    assert {(d["state"], d["observed"]) for d in doc["desired"]} == {("missing", None)}
    text = run_cli(cfg, "subscriptions", "status", env=env)
    assert text.returncode == 0 and "missing 3" in text.stdout, text.stderr
    for out in (viewer, unknown, queued, audit, status, text):
        assert "never-shown" not in out.stdout + out.stderr
