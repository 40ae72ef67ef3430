"""Nothing under daemon/, storage/, admin_ui/ or config/ reads the real clock except
daemon/services/clock.py: every other module takes its time from the clock it is given
(``Clock.now_us``) or from trio's clock (durations), so the simulation's virtual time
reaches every decision (issue 22)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("daemon", "storage", "admin_ui", "config")
ALLOWED = {"daemon/services/clock.py"}
TIME_READS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter",
              "perf_counter_ns", "process_time", "localtime", "gmtime", "ctime"}
DATETIME_READS = {"now", "utcnow", "today"}


def clock_reads(source: str) -> list[tuple[int, str]]:
    """(line, what) for every real-clock read in ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            found += [(node.lineno, f"from time import {a.name}") for a in node.names
                      if a.name in TIME_READS]
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id == "time" and node.attr in TIME_READS:
            found.append((node.lineno, f"time.{node.attr}"))
        names = {"datetime", "date", "dt"}
        if node.attr in DATETIME_READS and (
                (isinstance(base, ast.Name) and base.id in names)
                or (isinstance(base, ast.Attribute) and base.attr in {"datetime", "date"})):
            found.append((node.lineno, f"{ast.unparse(base)}.{node.attr}"))
    return found


def offenders() -> list[str]:
    out = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in ALLOWED:
                continue
            out += [f"{rel}:{line}: {what}" for line, what in clock_reads(path.read_text())]
    return out


def test_no_module_reads_the_real_clock_but_the_clock_module() -> None:
    assert offenders() == []


@pytest.mark.parametrize(("source", "expected"), [
    ("import time\nx = time.time()\n", ["time.time"]),
    ("import time\nx = time.monotonic()\n", ["time.monotonic"]),
    ("import time\nf = time.perf_counter\n", ["time.perf_counter"]),
    ("from time import time_ns\n", ["from time import time_ns"]),
    ("import datetime\nx = datetime.datetime.now()\n", ["datetime.datetime.now"]),
    ("from datetime import date\nx = date.today()\n", ["date.today"]),
    ("import datetime as dt\nx = dt.datetime.utcnow()\n", ["dt.datetime.utcnow"]),
    # Negative rows: trio's clock, sleeping and formatting a given time are not reads.
    ("import trio\nx = trio.current_time()\n", []),
    ("import time\ntime.sleep(0)\n", []),
    ("import datetime\nx = datetime.datetime.fromtimestamp(0)\n", []),
])
def test_the_walk_finds_each_kind_of_read(source: str, expected: list[str]) -> None:
    assert [what for _, what in clock_reads(source)] == expected
