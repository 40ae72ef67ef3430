"""bench.seqload's history rollup is built a UTC day a statement: every execution's day
is covered once, and no statement reads past its day."""

from __future__ import annotations

import re

import pytest

from bench.seqload import DAY_US, rollup_statements

D = 20_000 * DAY_US  # a UTC midnight


@pytest.mark.parametrize(("first", "last", "days"), [
    (D, D, [D]),
    (D + 5, D + DAY_US - 1, [D]),
    (D + DAY_US - 1, D + DAY_US, [D, D + DAY_US]),  # a microsecond apart, two days
    (D + 3, D + 3 * DAY_US + 7, [D, D + DAY_US, D + 2 * DAY_US, D + 3 * DAY_US]),
])
def test_one_day_a_statement_each_day_once(first: int, last: int, days: list[int]) -> None:
    sqls = rollup_statements(first, last)
    assert len(sqls) == 4 * len(days)  # old rows out, minute rows, the hours, the day
    for n, day in enumerate(days):
        clear, minute, hour, whole = sqls[4 * n: 4 * n + 4]
        assert clear == ("DELETE FROM history_rollup"
                         f" WHERE bucket_us >= {day} AND bucket_us < {day + DAY_US}")
        assert "FROM work_executions" in minute
        assert f"finished_at_us >= {day} AND finished_at_us < {day + DAY_US}" in minute
        for level, sql in ((3_600_000_000, hour), (DAY_US, whole)):
            assert sql.startswith("INSERT INTO history_rollup") and f"SELECT {level}," in sql
            assert f"bucket_us >= {day} AND bucket_us < {day + DAY_US}" in sql
    # every statement names a one-day range
    for sql in sqls:
        lo, hi = map(int, re.findall(r">= (\d+) AND \w+ < (\d+)", sql)[0])
        assert hi - lo == DAY_US and lo % DAY_US == 0
