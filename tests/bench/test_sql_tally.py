"""``bench.sql_tally``'s snapshots: each SIGUSR1 keeps a copy of the counts by transaction
so far, which ``bench.kernel`` takes around a drain so that the difference is the drain's
alone. A real replica on MariaDB, counted from its own process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio

from bench.kernel import (
    fresh_url,
    mysql_admin,
    prepare,
    scrape,
    snapshot_tally,
    start_replica,
    wait_admin,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.mysql]

STATEMENTS = "integrationd_db_statements_total"


def test_each_sigusr1_keeps_the_counts_so_far_and_they_only_grow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_SQL_TALLY_DIR", str(tmp_path))
    url, name = fresh_url("mysql", tmp_path)
    assert name is not None
    try:
        trio.run(prepare, url, 0, "NORMAL")
        proc, log = start_replica(write_config(tmp_path, url, "NORMAL"), 0)
        try:
            admin = wait_admin(proc, log, time.monotonic() + 120)
            snapshot_tally(proc)
            # The replica's own loops (heartbeat, polls) send more statements meanwhile:
            # wait until its metrics say so, not for a fixed time.
            sent = scrape(admin)[STATEMENTS]
            deadline = time.monotonic() + 60
            while scrape(admin)[STATEMENTS] <= sent:
                assert time.monotonic() < deadline, "the replica sent no statement in 60 s"
                time.sleep(0.1)
            snapshot_tally(proc)
        finally:
            proc.terminate()
            assert proc.wait(timeout=60) == 0, log.read_text()[-2000:]
    finally:
        mysql_admin(f"DROP DATABASE {name}")
    out = json.loads((tmp_path / "replica-0.json").read_text())
    first, second = out["snapshots"]
    final = out["by_transaction"]
    assert first and first.get("replica.heartbeat", 0) >= 1, first
    assert all(second.get(k, 0) >= n for k, n in first.items()), (first, second)
    assert all(final.get(k, 0) >= n for k, n in second.items()), (second, final)
    assert sum(second.values()) > sum(first.values()), (first, second)
