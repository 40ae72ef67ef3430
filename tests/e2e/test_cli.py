"""The ``integrationd`` command line, as an operator uses it: real processes, real databases."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from daemon.core.outcomes import DeadLetter
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.processes import cli_env, run_cli, write_config
from tests.support.work import claim, enqueue, finalize


def test_bad_config_is_one_line_naming_the_key_and_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[work]\nconcurrency = "lots"\n')
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "integrationd: config error: work.concurrency: expected an integer, got 'lots'"
    ]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[storage]\nurl = 'postgres://x'\n", "storage.url"),
        ("[storage]\nurl = 'mysql://u:pw@h:3306/db'\n", "storage.url"),
        ("[storage]\npassword = 'x'\n", "storage.password"),
        ("[admin]\nlisten = 'nowhere'\n", "admin.listen"),
        ("[families.nosuch]\nbatch_size = 1\n", "families.nosuch"),
        ("[families.noop]\nlease_ttl = 1.0\n", "families.noop.lease_ttl"),
        ("[work]\nbogus = 1\n", "work.bogus"),
        ("[[operators]]\nname = 'a'\nrole = 'root'\n", "operators[0].role"),
        ("not toml at all [", "--config"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, toml: str, key: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml)
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    assert f"config error: {key}" in result.stderr
    assert "pw@" not in result.stderr


def test_missing_config_file(tmp_path: Path) -> None:
    result = run_cli(tmp_path / "absent.toml", "check-config")
    assert result.returncode == 2
    assert "no such file" in result.stderr


def test_unreachable_database_at_start_is_a_clear_error(tmp_path: Path) -> None:
    # run and migrate wait storage.startup_timeout (with a log line per try), then fail.
    cfg = write_config(tmp_path / "a.toml", "mysql://root@127.0.0.1:9/nothing",
                       storage_extra="startup_timeout = 1.0")
    for command in (["run"], ["migrate"]):
        result = run_cli(cfg, *command)
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if not line.startswith("{")]
        assert len(errors) == 1, result.stderr
        assert errors[0].startswith("integrationd: database unreachable"
                                    " (mysql://root@127.0.0.1:9/nothing): ")
        assert "storage.startup_timeout" in errors[0]
        assert '"event":"database_waiting"' in result.stderr
        assert "Traceback" not in result.stderr


def test_run_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "a.toml", f"sqlite:///{tmp_path / 'empty.db'}")
    result = run_cli(cfg, "run")
    assert result.returncode == 1
    assert "run `integrationd migrate`" in result.stderr


def test_secrets_come_from_the_environment_and_are_never_printed(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "a.toml", "mysql://root@127.0.0.1:3306/test")
    env = cli_env()
    env["INTEGRATIOND_STORAGE_PASSWORD"] = "hunter2-secret"
    result = run_cli(cfg, "check-config", env=env)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["storage"]["password"] == "set"
    assert "hunter2" not in result.stdout + result.stderr


async def test_operator_verbs(database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    assert run_cli(cfg, "migrate").returncode == 0

    out = run_cli(cfg, "work", "enqueue", "noop", "--count", "3", "--org", "acme")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["enqueued"] == 3

    unknown = run_cli(cfg, "work", "enqueue", "nosuch")
    assert unknown.returncode == 2
    assert "unknown work family 'nosuch' (known: noop)" in unknown.stderr

    bad = run_cli(cfg, "work", "enqueue", "noop", "--payload", "{oops")
    assert bad.returncode == 2 and "payload is not valid JSON" in bad.stderr

    listed = json.loads(run_cli(cfg, "work", "list", "--org", "acme", "--json").stdout)
    assert len(listed) == 3
    assert all("payload" not in i and "lease_token" not in i for i in listed)

    bad_state = run_cli(cfg, "work", "list", "--state", "nosuch")
    assert bad_state.returncode == 2 and "unknown state 'nosuch'" in bad_state.stderr

    # Make one dead, then replay it: refused for a viewer, allowed for an operator.
    now = time.time_ns() // 1000
    (dead_id,) = await enqueue(store, now=now)
    (item,) = [i for i in (await claim(store, now=now, limit=10)).claimed
               if i.work_id == dead_id]
    await finalize(store, item, DeadLetter("bad", "provider said no"), now=now)

    refused = run_cli(cfg, "work", "replay", dead_id, "--actor", "victor", "--reason", "x")
    assert refused.returncode == 1 and "may not work.replay" in refused.stderr
    stranger = run_cli(cfg, "work", "replay", dead_id, "--actor", "mallory", "--reason", "x")
    assert stranger.returncode == 1 and "not a configured operator" in stranger.stderr

    replayed = run_cli(cfg, "work", "replay", dead_id, "--actor", "alice", "--reason",
                       "provider fixed", "--json")
    assert replayed.returncode == 0, replayed.stderr
    new = json.loads(replayed.stdout)
    assert new["replay_of"] == dead_id and new["state"] == "pending"

    again = run_cli(cfg, "work", "replay", dead_id, "--actor", "alice", "--reason", "x")
    assert again.returncode == 1 and "already replayed" in again.stderr

    shown = json.loads(run_cli(cfg, "work", "show", dead_id, "--json").stdout)
    assert shown["state"] == "dead"
    assert [e["outcome"] for e in shown["executions"]] == ["dead"]

    missing = run_cli(cfg, "work", "show", "01NOSUCHITEM00000000000000")
    assert missing.returncode == 1 and "no work item" in missing.stderr

    cancelled = json.loads(
        run_cli(cfg, "work", "cancel", new["work_id"], "--actor", "alice", "--reason",
                "superseded").stdout)
    assert cancelled == {"work_id": new["work_id"], "disposition": "cancelled",
                         "state": "cancelled"}

    # The test's own claim took the three acme items too; one dead item remains.
    depths = json.loads(run_cli(cfg, "work", "depths").stdout)
    assert sorted((d["state"], d["count"]) for d in depths) == [("dead", 1), ("processing", 3)]
