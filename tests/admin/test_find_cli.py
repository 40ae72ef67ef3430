"""``integrationd attempts list|show``, ``receipts list`` and ``search``, in-process:
plain text by default, ``--json``, bad filters exit 2, not found exits 1."""

from __future__ import annotations

import argparse
import json

import pytest

from config.settings import Settings, StorageSettings
from daemon.cli import _open
from daemon.find_cli import FIND_COMMANDS, add_find_commands, run_find_command
from daemon.services.clock import WallClock
from tests.admin.support import ConsoleHarness, operators
from tests.support.find import SECRETS, seed_calls


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="integrationd")
    sub = parser.add_subparsers(dest="command", required=True)
    add_find_commands(sub)
    args = parser.parse_args(argv)
    assert args.command in FIND_COMMANDS
    return args


async def test_attempts_list_show_receipts_and_search(
        console: ConsoleHarness, capsys: pytest.CaptureFixture[str]) -> None:
    settings = Settings(storage=StorageSettings(url=console.database.url,
                                                sqlite_synchronous="NORMAL"),
                        operators=operators())
    seeded = await seed_calls(console.store, WallClock().now_us() - 60_000_000)
    throttled = [s.attempt_id for s in reversed(seeded) if s.status == 429]

    async def run(*argv: str) -> tuple[int, str, str]:
        code = await run_find_command(settings, _parse(*argv), _open)
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = await run("attempts", "list", "--status", "429", "--json")
    assert code == 0
    doc = json.loads(out)
    assert [i["attempt_id"] for i in doc["items"]] == throttled
    assert doc["next_after"] is None
    code, out, err = await run("attempts", "list", "--status", "429", "--limit", "2")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == throttled[:2]
    assert "HTTP 429" in out and f"--after {throttled[1]}" in err
    code, out, _ = await run("attempts", "list", "--status", "500")
    assert (code, out) == (0, "no effect attempts match\n")
    code, _, err = await run("attempts", "list", "--status", "abc")
    assert code == 2 and "status must be a whole number" in err
    code, _, err = await run("attempts", "list", "--since", "last week")
    assert code == 2 and "since: a time is ISO 8601" in err

    code, out, _ = await run("attempts", "show", seeded[1].attempt_id)
    assert code == 0 and "answer body:" in out and "answered 429" in out
    assert not any(secret in out for secret in SECRETS)
    code, out, _ = await run("attempts", "show", seeded[1].attempt_id, "--json")
    assert json.loads(out)["attempt"]["response_status"] == 429
    code, _, err = await run("attempts", "show", "01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert code == 1 and "no effect attempt" in err

    code, out, _ = await run("receipts", "list", "--status", "pending")
    assert (code, out) == (0, "no runtime receipts match\n")
    code, _, err = await run("receipts", "list", "--status", "lost")
    assert code == 2 and "status must be one of" in err

    code, out, _ = await run("search", seeded[2].command_id)
    assert code == 0 and out.startswith("command") and seeded[2].work_id in out
    code, out, err = await run("search", "no-such-thing", "--json")
    assert code == 1 and json.loads(out)["matches"] == [] and "nothing has the id" in err
