"""``integrationd hash-password``, ``audit list`` and ``dlq list|classes|replay``, in-process."""

from __future__ import annotations

import argparse
import io
import json

import pytest
from argon2 import PasswordHasher

from config.settings import Settings, StorageSettings
from daemon.admin_cli import ADMIN_COMMANDS, add_admin_commands, run_admin_command
from tests.admin.support import ConsoleHarness, operators


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="integrationd")
    sub = parser.add_subparsers(dest="command", required=True)
    add_admin_commands(sub)
    args = parser.parse_args(argv)
    assert args.command in ADMIN_COMMANDS
    return args


def _settings(console: ConsoleHarness) -> Settings:
    return Settings(storage=StorageSettings(url=console.database.url, sqlite_synchronous="NORMAL"),
                    operators=operators())


async def test_hash_password_reads_stdin_and_prints_only_the_hash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("correct horse\n"))
    assert await run_admin_command(Settings(), _parse("hash-password")) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("$argon2id$") and "correct horse" not in out
    assert PasswordHasher().verify(out, "correct horse")
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert await run_admin_command(Settings(), _parse("hash-password")) == 2
    assert "empty" in capsys.readouterr().err


async def test_dlq_and_audit_verbs(console: ConsoleHarness,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    settings = _settings(console)
    dead = await console.dead_items(3, failure_class="boom")
    assert await run_admin_command(settings, _parse("dlq", "classes", "--json")) == 0
    classes = json.loads(capsys.readouterr().out)["classes"]
    assert classes == [{"family": "noop", "failure_class": "boom", "count": 3}]

    refused = _parse("dlq", "replay", "--family", "noop", "--actor", "viv", "--reason", "r")
    assert await run_admin_command(settings, refused) == 1
    assert "may not work.replay" in capsys.readouterr().err

    replay = _parse("dlq", "replay", "--family", "noop", "--class", "boom", "--limit", "2",
                    "--actor", "otto", "--reason", "provider fixed", "--json")
    assert await run_admin_command(settings, replay) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["selected"] == 2 and report["replayed"] == 2

    assert await run_admin_command(settings, _parse("dlq", "list", "--unreplayed",
                                                    "--json")) == 0
    waiting = json.loads(capsys.readouterr().out)["items"]
    assert [i["work_id"] for i in waiting] == [w for w in dead
                                              if w not in {i["work_id"] for i in
                                                           report["items"]}]
    assert "payload" not in waiting[0]

    assert await run_admin_command(settings, _parse("audit", "list", "--json")) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [e["action"] for e in entries].count("work.replay") == 2
    assert entries[0]["action"] == "dlq.bulk_replay" and entries[0]["actor"] == "otto"
    assert await run_admin_command(settings, _parse("audit", "list")) == 0
    assert "provider fixed" in capsys.readouterr().out

    assert await run_admin_command(settings, _parse("dlq", "list", "--limit", "0")) == 2
    assert "--limit" in capsys.readouterr().err
