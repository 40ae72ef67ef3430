"""The command line speaks one way (issue 23 item 5): every read verb takes ``--json``
and prints text by default, an empty listing says so, an unknown family is refused
(exit 2) rather than matching nothing, and no help text cites the design documents.
Real processes on a real SQLite database; the help texts are read from the parser."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cli import _parser
from tests.support.backends import FreshDatabase
from tests.support.processes import run_cli, write_config

# Verbs that only read: each takes --json.
READS = {"list", "show", "status", "depths", "count", "classes", "project"}
DESIGN_WORDS = re.compile(r"\bseed\b|§|\bsection\b|design doc", re.IGNORECASE)


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
           ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from leaves(sub, (*path, name))


def test_every_read_verb_takes_json_and_help_speaks_the_operators_language() -> None:
    no_json, cites = [], []
    for path, parser in leaves(_parser()):
        options = {o for a in parser._actions for o in a.option_strings}
        if path and path[-1] in READS and "--json" not in options:
            no_json.append(" ".join(path))
        cites += [f"{' '.join(path)}: {line.strip()}"
                  for line in parser.format_help().splitlines() if DESIGN_WORDS.search(line)]
    assert no_json == [] and cites == []


@pytest.mark.parametrize("backend", ["sqlite"])  # output only
async def test_empty_listings_say_so_and_unknown_families_are_refused(
    backend: str, database: FreshDatabase, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    catalog = run_cli(cfg, "catalog", "list")
    assert catalog.returncode == 0 and catalog.stdout.startswith("no catalog revision"), (
        catalog.stdout, catalog.stderr)
    subscriptions = run_cli(cfg, "subscriptions", "status")
    assert subscriptions.returncode == 0
    assert subscriptions.stdout.startswith("no subscription is desired"), subscriptions.stdout
    for verb in (("work", "list"), ("dlq", "list")):
        refused = run_cli(cfg, *verb, "--family", "bogus")
        assert refused.returncode == 2, (verb, refused.stdout, refused.stderr)
        assert "unknown work family 'bogus'" in refused.stderr
