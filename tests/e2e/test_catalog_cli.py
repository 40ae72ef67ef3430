"""``integrationd catalog ...`` and the revision ``run`` serves: real processes, real databases."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.backends import FreshDatabase
from tests.support.processes import cli_env, run_cli, write_config


def _config(tmp_path: Path, url: str, *, revision: int = 7,
            base_url: str = "http://127.0.0.1:9") -> Path:
    return write_config(tmp_path / "a.toml", url, extra=f"""
[[operators]]
name = "ada"
role = "admin"

[catalog]
revision = {revision}

[[bindings]]
binding_id = "hubspot-main"
provider = "hubspot"
org_id = "org-1"
app_installation_id = "install-1"
remote_account_id = "portal-1"
base_url = "{base_url}"
auth = "static_token"
""")


def _env() -> dict[str, str]:
    env = cli_env()
    env["INTEGRATIOND_BINDING_HUBSPOT_MAIN_TOKEN"] = "binding-token-never-shown"
    return env


async def test_publish_list_show_delete(database: FreshDatabase, tmp_path: Path) -> None:
    cfg = _config(tmp_path, database.url)
    env = _env()
    published = run_cli(cfg, "catalog", "publish", "--actor", "ada", "--reason", "first",
                        "--json", env=env)
    assert published.returncode == 0, published.stderr
    doc = json.loads(published.stdout)
    assert (doc["revision"], doc["created"], doc["published_by"]) == (7, True, "ada")
    again = run_cli(cfg, "catalog", "publish", "--actor", "ada", "--reason", "again", env=env)
    assert again.returncode == 0
    assert again.stdout == (f"catalog revision 7 is already published with this content"
                            f" ({doc['digest']})\n")

    listed = json.loads(run_cli(cfg, "catalog", "list", "--json", env=env).stdout)
    assert listed == {"revisions": [{
        "revision": 7, "digest": doc["digest"], "published_by": "ada",
        "published_at_us": doc["published_at_us"], "open_commands": 0,
        "open_commands_more": False, "live_work": 0, "live_work_more": False,
        "current": True}]}
    shown = run_cli(cfg, "catalog", "show", "7", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    content = json.loads(shown.stdout)["content"]
    assert content["bindings"][0]["base_url"] == "http://127.0.0.1:9"
    assert content["definitions"][0]["provider"] == "hubspot"
    assert "binding-token-never-shown" not in shown.stdout + shown.stderr

    # Other content under a published number is refused; a new number is not.
    cfg = _config(tmp_path, database.url, base_url="http://127.0.0.1:10")
    conflict = run_cli(cfg, "catalog", "publish", "--actor", "ada", "--reason", "x", env=env)
    assert conflict.returncode == 1
    assert conflict.stderr.strip().splitlines() == [
        f"integrationd: catalog revision 7 is already published with digest {doc['digest']};"
        " publish this content under a new revision number"]
    second = run_cli(cfg, "catalog", "publish", "--revision", "8", "--actor", "ada",
                     "--reason", "new base url", env=env)
    assert second.returncode == 0 and second.stdout.startswith("published catalog revision 8")

    deleted = run_cli(cfg, "catalog", "delete", "7", "--actor", "ada", "--reason", "old",
                      env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == f"deleted catalog revision 7 ({doc['digest']})\n"
    audit = json.loads(run_cli(cfg, "audit", "list", "--json", env=env).stdout)["entries"]
    assert [(e["action"], e["target_id"], e["actor"]) for e in audit
            if e["target_kind"] == "catalog_revision"] == [
        ("catalog.delete", "7", "ada"), ("catalog.publish", "8", "ada"),
        ("catalog.publish", "7", "ada")]


async def test_a_revision_that_does_not_exist_is_one_line_naming_it_exit_1(
        database: FreshDatabase, tmp_path: Path) -> None:
    cfg = _config(tmp_path, database.url)
    env = _env()
    for args in (["show", "9"], ["delete", "9", "--actor", "ada", "--reason", "x"]):
        result = run_cli(cfg, "catalog", *args, env=env)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().splitlines() == [
            "integrationd: REV: catalog revision 9 is not published"]
    bad = run_cli(cfg, "catalog", "show", "zero", env=env)
    assert bad.returncode == 2 and "expected a revision number, got 'zero'" in bad.stderr
    # The revision the config names must be published, with this config's content.
    run = run_cli(cfg, "run", env=env)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == (
        "integrationd: config error: catalog.revision: revision 7 is not published"
        " (integrationd catalog publish)")
    assert run_cli(cfg, "catalog", "publish", "--actor", "ada", "--reason", "r",
                   env=env).returncode == 0
    changed = _config(tmp_path, database.url, base_url="http://127.0.0.1:10")
    run = run_cli(changed, "run", env=env)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith(
        "integrationd: config error: catalog.revision: revision 7 is published with digest")


async def test_only_admins_publish_or_delete(database: FreshDatabase, tmp_path: Path) -> None:
    cfg = _config(tmp_path, database.url)
    env = _env()
    for args in (["publish", "--actor", "alice", "--reason", "r"],
                 ["delete", "7", "--actor", "victor", "--reason", "r"]):
        result = run_cli(cfg, "catalog", *args, env=env)
        assert result.returncode == 1
        assert "may not catalog." in result.stderr
    assert json.loads(run_cli(cfg, "catalog", "list", "--json",
                              env=env).stdout) == {"revisions": []}
