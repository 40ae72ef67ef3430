"""bench.server_pages sums MariaDB's slow log by statement shape (a real log's layout)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from bench.server_pages import last_json, report, shape, slow_log_path, summarize

LOG = """\
/usr/sbin/mariadbd, Version: 10.11.19-MariaDB-0+deb12u1 (Debian 12). started with:
Tcp port: 3306  Unix socket: /run/mysqld/mysqld.sock
Time\t\t    Id Command\tArgument
# Time: 261207 13:01:02
# User@Host: root[root] @  [127.0.0.1]
# Thread_id: 2751  Schema: bench_1  QC_hit: No
# Query_time: 0.000130  Lock_time: 0.000000  Rows_sent: 0  Rows_examined: 0
# Rows_affected: 1  Bytes_sent: 11
# Pages_accessed: 6  Pages_read: 0  Pages_prefetched: 0  Pages_updated: 5  Old_rows_read: 0
use `bench_1`;
SET timestamp=1796648462;
UPDATE work_items SET state = 'processing' WHERE work_id IN ('a', 'b', 'c');
# User@Host: root[root] @  [127.0.0.1]
# Thread_id: 2752  Schema: bench_1  QC_hit: No
# Query_time: 0.250000  Lock_time: 0.000000  Rows_sent: 1  Rows_examined: 400
# Pages_accessed: 2000  Pages_read: 0  Pages_prefetched: 0  Pages_updated: 0  Old_rows_read: 350
# Full_scan: No  Full_join: No  Tmp_table: No  Tmp_table_on_disk: No
SET timestamp=1796648462;
SELECT COUNT(*) FROM work_items
 WHERE state = 'pending' AND family = 'noop' LIMIT 10001;
# User@Host: root[root] @  [127.0.0.1]
# Thread_id: 2753  Schema: bench_1  QC_hit: No
# Query_time: 0.150000  Lock_time: 0.000000  Rows_sent: 1  Rows_examined: 100
# Pages_accessed: 1000  Pages_read: 0  Pages_prefetched: 0  Pages_updated: 0  Old_rows_read: 50
SET timestamp=1796648463;
SELECT COUNT(*) FROM work_items WHERE state = 'retry' AND family = 'inbound_apply' LIMIT 9;
# User@Host: root[root] @  [127.0.0.1]
# Thread_id: 2754  Schema: bench_1  QC_hit: No
# Query_time: 0.000010  Lock_time: 0.000000  Rows_sent: 0  Rows_examined: 0
# Pages_accessed: 1  Pages_read: 0  Pages_prefetched: 0  Pages_updated: 0  Old_rows_read: 0
SET timestamp=1796648463;
UPDATE work_items SET state = 'processing' WHERE work_id IN ('d');
"""


@pytest.mark.parametrize(("statement", "expected"), [
    ("SELECT 1 FROM t WHERE a = 5 AND b = 'x'", "SELECT ? FROM t WHERE a = ? AND b = ?"),
    ("UPDATE t SET s = 'p' WHERE id IN ('a', 'b', 'c')", "UPDATE t SET s = ? WHERE id IN (?..)"),
    ("UPDATE t SET s = 'p' WHERE id IN ('d')", "UPDATE t SET s = ? WHERE id IN (?)"),
    ("INSERT INTO t VALUES (1, 'a'), (2, 'b')", "INSERT INTO t VALUES (?..), (?..)"),
    ("SELECT  a\n  FROM t", "SELECT a FROM t"),
    ("SELECT 'it''s' FROM t", "SELECT ?? FROM t"),
    ("SELECT r0.* FROM t r0", "SELECT r0.* FROM t r0"),  # a name's digits stay
])
def test_shape(statement: str, expected: str) -> None:
    assert shape(statement) == expected


def test_summarize_folds_shapes_and_sums_innodb_figures() -> None:
    costs = summarize(LOG.splitlines(keepends=True))
    counts = {c.shape: c for c in costs}
    count = counts["SELECT COUNT(*) FROM work_items WHERE state = ? AND family = ? LIMIT ?"]
    assert count.count == 2
    assert count.figures == {"Query_time": pytest.approx(0.4), "Rows_examined": 500,
                             "Pages_accessed": 3000, "Old_rows_read": 400}
    update = counts["UPDATE work_items SET state = ? WHERE work_id IN (?..)"]
    assert (update.count, update.figures["Pages_accessed"]) == (1, 6)
    assert counts["UPDATE work_items SET state = ? WHERE work_id IN (?)"].count == 1
    # The server's header, `use`, `SET timestamp` and the comment lines are no statements.
    assert len(costs) == 3
    assert costs[0] is count  # most page accesses first


def test_report_totals_and_top() -> None:
    result = report(summarize(LOG.splitlines()), top=1)
    assert result["statements"] == 4
    assert result["totals"] == {"Query_time": 0.4, "Rows_examined": 500.0,
                                "Pages_accessed": 3007.0, "Old_rows_read": 400.0}
    assert [t["count"] for t in result["top"]] == [2]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("output", "expected"), [
    ('progress\n{"items_per_s": 5.0}\n', {"items_per_s": 5.0}),
    ("", None),
    ("Traceback (most recent call last):\n  boom\n", None),
])
def test_last_json(output: str, expected: object) -> None:
    assert last_json(output) == expected


def test_a_named_log_leaves_its_directory_as_it_was(tmp_path: Path) -> None:
    """--log in a directory of the caller's (/tmp, say): its mode is not touched (it once
    was made 0777, which took /tmp's sticky bit away)."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    log, own = slow_log_path(shared / "slow.log")
    assert (log, own) == (shared / "slow.log", False)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777


def test_the_default_log_is_in_a_fresh_directory_the_server_can_write() -> None:
    log, own = slow_log_path(None)
    try:
        assert own and log.name == "slow.log" and not log.exists()
        assert stat.S_IMODE(log.parent.stat().st_mode) == 0o777
    finally:
        log.parent.rmdir()
