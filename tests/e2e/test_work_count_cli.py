"""``integrationd work count``: totals by family and state of the items created in a time
range, and the executions that finished in it, as text and ``--json`` (issue 23 item 5).
A real process on a real SQLite database."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.core.outcomes import DeadLetter
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.processes import run_cli, write_config
from tests.support.work import T0, claim, enqueue, finalize

HOUR = 3_600_000_000
# T0 is 2027-01-15 08:00:00Z.
EARLY = ("--since", "2027-01-15T07:00:00Z", "--until", "2027-01-15T09:00:00Z")
LATE = ("--since", "2027-01-15T09:00:00Z", "--until", "2027-01-15T11:00:00Z")


@pytest.mark.parametrize("backend", ["sqlite"])  # output only
async def test_work_count_totals_by_family_state_and_range(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    await enqueue(store, 3, now=T0)
    (item,) = (await claim(store, now=T0 + 1, limit=1)).claimed
    await finalize(store, item, DeadLetter("provider_down", "503"), now=T0 + 2)
    await enqueue(store, 2, now=T0 + 2 * HOUR)

    doc = json.loads(run_cli(cfg, "work", "count", *EARLY, "--json").stdout)
    assert doc["created"] == [{"family": "noop", "state": "dead", "count": 1},
                              {"family": "noop", "state": "pending", "count": 2}]
    assert (doc["by_family"], doc["by_state"], doc["total"]) == (
        {"noop": 3}, {"dead": 1, "pending": 2}, 3)
    assert doc["finished"] == [{"family": "noop", "outcome": "dead", "count": 1}]
    assert (doc["since"], doc["until"]) == ("2027-01-15T07:00:00.000000Z",
                                            "2027-01-15T09:00:00.000000Z")

    text = run_cli(cfg, "work", "count", *LATE)
    assert text.returncode == 0, text.stderr
    lines = [line.split() for line in text.stdout.splitlines()]
    assert lines[0][:3] == ["work", "created", "from"] and "2027-01-15 09:00:00Z" in text.stdout
    assert ["noop", "pending", "2"] in lines and ["total", "2"] in lines
    assert "no execution finished in that range" in text.stdout

    empty = run_cli(cfg, "work", "count", "--since", "2027-02-01", "--until", "2027-02-02")
    assert "no work items were created in that range" in empty.stdout

    # (The parser's other refusals: tests/core/test_time_range.py.)
    for args, said in ((("--since", "yesterday"), "is not a time"),
                       (("--family", "bogus"), "unknown work family 'bogus'")):
        refused = run_cli(cfg, "work", "count", *args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert said in refused.stderr and "Traceback" not in refused.stderr
