"""An ``integrationd`` call imports its own command's module, not every command's: a read
verb does not load the console (Quart, Hypercorn, Jinja), the HTTP client, the reconciler
or the other commands' modules (daemon/cli_commands.py). Real processes on a real SQLite
database, each asked which modules it loaded; and the lazily built parser says exactly
what the whole one says."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cli import _parser
from daemon.cli_commands import COMMANDS
from tests.support.backends import FreshDatabase
from tests.support.processes import cli_env, write_config

# What only the console, the replica or other commands load.
NOT_FOR_A_READ = ("quart", "hypercorn", "flask", "jinja2", "httpx", "argon2", "admin_ui.app",
                  "admin_ui.actions", "daemon.services.assembly", "daemon.services.reconcile",
                  "daemon.services.replica", "daemon.reconcile_cli", "daemon.find_cli",
                  "daemon.binding_cli", "daemon.history_cli")

PROBE = """
import json, sys
from daemon.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, sorted(sys.modules)]))
"""


def loaded(config: Path, *args: str) -> tuple[int, set[str]]:
    """Run one command in a fresh interpreter: its exit code and the modules it loaded."""
    done = subprocess.run([sys.executable, "-c", PROBE, "--config", str(config), *args],
                          capture_output=True, text=True, cwd=config.parent, env=cli_env(),
                          timeout=120, check=False)
    code, modules = json.loads(done.stdout.splitlines()[-1])
    return code, set(modules)


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in NOT_FOR_A_READ
                  if m in modules or any(n.startswith(m + ".") for n in modules))


@pytest.mark.parametrize("backend", ["sqlite"])  # what loads, not what the database says
async def test_a_read_verb_loads_neither_the_console_nor_the_other_commands(
        backend: str, database: FreshDatabase, tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    code, modules = loaded(cfg, "work", "count")
    assert code == 0 and heavy(modules) == []
    # --help: no command's module at all.
    code, modules = loaded(cfg, "--help")
    assert code == 0 and heavy(modules) == []
    assert sorted(m for m in modules if m.startswith("daemon.") and m.endswith("_cli")) == []
    # The probe sees what a command does load: reconcile status loads its own module
    # (and the reconciler), still not the console.
    code, modules = loaded(cfg, "reconcile", "status")
    assert code == 0
    assert heavy(modules) == ["daemon.reconcile_cli", "daemon.services.reconcile", "httpx"]


def test_the_lazy_parser_reads_as_the_whole_one() -> None:
    """Top-level help from the bare parser the first pass uses, and each command's help
    from the parser the second pass builds, equal those of the parser with every command."""
    whole = _parser()
    assert _parser(lambda command: False).format_help() == whole.format_help()
    for name in COMMANDS:
        adder = COMMANDS[name][1]

        def same_module(command: str, adder: str = adder) -> bool:
            return COMMANDS[command][1] == adder

        assert (command_parser(_parser(same_module), name).format_help()
                == command_parser(whole, name).format_help()), name


def command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found: argparse.ArgumentParser = commands.choices[name]
    return found
