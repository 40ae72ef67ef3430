"""``integrationd reconcile start|repair|status``: audited operator actions, real processes,
real databases; bad input one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.backends import FreshDatabase
from tests.support.processes import cli_env, run_cli, write_config


def _config(tmp_path: Path, url: str) -> Path:
    return write_config(tmp_path / "a.toml", url, extra="""
[[operators]]
name = "ada"
role = "admin"

[[operators]]
name = "val"
role = "viewer"

[catalog]
revision = 7

[[bindings]]
binding_id = "outreach-main"
provider = "outreach"
org_id = "org-1"
app_installation_id = "install-1"
remote_account_id = "org-77"
base_url = "http://127.0.0.1:9"
# Its token comes from the environment below: a static token, declared as such.
auth = "static_token"
""")


def _env() -> dict[str, str]:
    env = cli_env()
    env["INTEGRATIOND_BINDING_OUTREACH_MAIN_TOKEN"] = "binding-token-never-shown"
    return env


STREAM = ("--binding", "outreach-main", "--resource", "prospect")


async def test_start_repair_status_are_audited(database: FreshDatabase, tmp_path: Path) -> None:
    cfg, env = _config(tmp_path, database.url), _env()
    unpublished = run_cli(cfg, "reconcile", "start", *STREAM, "--actor", "ada", "--reason",
                          "go", env=env)
    assert unpublished.returncode == 2
    assert "is not published" in unpublished.stderr
    assert run_cli(cfg, "catalog", "publish", "--actor", "ada", "--reason", "r",
                   env=env).returncode == 0
    started = run_cli(cfg, "reconcile", "start", *STREAM, "--actor", "ada", "--reason",
                      "first sync", env=env)
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("stream outreach-main:prospect: queued run as work item")
    again = run_cli(cfg, "reconcile", "start", *STREAM, "--actor", "ada", "--reason", "x",
                    env=env)
    assert again.returncode == 0 and "already queued" in again.stdout
    repair = run_cli(cfg, "reconcile", "repair", *STREAM, "--from", "2026-11-01T00:00:00Z",
                     "--to", "2026-11-02T00:00:00Z", "--actor", "ada", "--reason",
                     "webhooks lost on Nov 1", env=env)
    assert repair.returncode == 0, repair.stderr
    assert "queued repair run" in repair.stdout
    audit = json.loads(run_cli(cfg, "audit", "list", "--target", "outreach-main:prospect",
                               "--json", env=env).stdout)
    entries = audit["entries"] if isinstance(audit, dict) else audit
    actions = sorted(e["action"] for e in entries)
    assert actions == ["reconcile.repair", "reconcile.start", "reconcile.start"]
    repaired = next(e for e in entries if e["action"] == "reconcile.repair")
    assert repaired["reason"] == "webhooks lost on Nov 1" and repaired["actor"] == "ada"
    assert repaired["after"]["mode"] == "repair"
    status = run_cli(cfg, "reconcile", "status", "--json", env=env)
    assert status.returncode == 0 and json.loads(status.stdout) == {"streams": []}
    as_text = run_cli(cfg, "reconcile", "status", env=env)
    assert as_text.stdout == "no reconciliation streams yet (integrationd reconcile start)\n"
    assert "binding-token-never-shown" not in "".join(
        r.stdout + r.stderr for r in (started, repair, status))


async def test_bad_reconcile_input_is_one_line_and_exit_2(database: FreshDatabase,
                                                          tmp_path: Path) -> None:
    cfg, env = _config(tmp_path, database.url), _env()
    assert run_cli(cfg, "catalog", "publish", "--actor", "ada", "--reason", "r",
                   env=env).returncode == 0
    cases = [
        (("repair", *STREAM, "--from", "yesterday"), 2, "--from: 'yesterday' is not"),
        (("repair", *STREAM), 2, "give --from (a bounded period) or --full"),
        (("repair", *STREAM, "--full", "--from", "2026-11-01T00:00:00Z"), 2, "not both"),
        (("repair", *STREAM, "--from", "2026-11-02T00:00:00Z", "--to",
          "2026-11-01T00:00:00Z"), 2, "--to is before --from"),
        (("start", "--binding", "nope", "--resource", "prospect"), 2, "no binding 'nope'"),
        (("start", "--binding", "outreach-main", "--resource", "account"), 2,
         "no listable resource 'account'"),
    ]
    for argv, code, says in cases:
        result = run_cli(cfg, "reconcile", *argv, "--actor", "ada", "--reason", "x", env=env)
        assert result.returncode == code, (argv, result.stderr)
        (line,) = result.stderr.strip().splitlines()
        assert says in line, line
    viewer = run_cli(cfg, "reconcile", "start", *STREAM, "--actor", "val", "--reason", "x",
                     env=env)
    assert viewer.returncode == 1 and "may not reconcile.start" in viewer.stderr
