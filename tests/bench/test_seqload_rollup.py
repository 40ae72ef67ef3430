"""bench.seqload's history rollup is built a UTC day at a time: every execution's day is
covered once, no statement reads past its day, and the rows are the keyed ones (five
minutes too) a rebuild writes."""

from __future__ import annotations

import re

import pytest

from bench.seqload import DAY_US, STATEMENTS_A_DAY, rollup_statements
from daemon.core.outcomes import Succeeded
from storage.history import EXECUTION_LEVELS_US
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, backend_params
from tests.support.history import finish_effects
from tests.support.work import T0, claim, enqueue, finalize

D = 20_000 * DAY_US  # a UTC midnight


@pytest.mark.parametrize(("first", "last", "days"), [
    (D, D, [D]),
    (D + 5, D + DAY_US - 1, [D]),
    (D + DAY_US - 1, D + DAY_US, [D, D + DAY_US]),  # a microsecond apart, two days
    (D + 3, D + 3 * DAY_US + 7, [D, D + DAY_US, D + 2 * DAY_US, D + 3 * DAY_US]),
])
def test_one_day_a_statement_each_day_once(first: int, last: int, days: list[int]) -> None:
    sqls = rollup_statements(first, last)
    # old rows out, minute rows, the five minutes, the hours, the six hours, the day
    assert len(sqls) == STATEMENTS_A_DAY * len(days) == 6 * len(days)
    for n, day in enumerate(days):
        clear, minute, five, hour, six, whole = sqls[6 * n: 6 * n + 6]
        assert clear == ("DELETE FROM history_rollup"
                         f" WHERE bucket_us >= {day} AND bucket_us < {day + DAY_US}")
        assert "FROM work_executions" in minute
        assert f"finished_at_us >= {day} AND e.finished_at_us < {day + DAY_US}" in minute
        for level, sql in ((300_000_000, five), (3_600_000_000, hour),
                           (21_600_000_000, six), (DAY_US, whole)):
            assert sql.startswith("INSERT INTO history_rollup") and f"SELECT {level}," in sql
            assert f"bucket_us >= {day} AND bucket_us < {day + DAY_US}" in sql
    # every statement names a one-day range
    for sql in sqls:
        lo, hi = map(int, re.findall(r">= (\d+) AND [\w.]+ < (\d+)", sql)[0])
        assert hi - lo == DAY_US and lo % DAY_US == 0


@pytest.mark.parametrize("backend", backend_params(["sqlite", "mysql"]))
async def test_the_statements_write_the_keyed_rows_a_rebuild_writes(
        database: FreshDatabase) -> None:
    """The rollup of a seqload database is the one ``integrationd history rebuild``
    writes: an effect item under its command's org, binding and operation, every level
    (five minutes too). Before, seqload wrote every item under no key and no
    five-minute rows, so a narrowed chart of a seqload database was empty."""
    store = await database.open_store()
    await finish_effects(store, T0)
    await finish_effects_later(store)
    await store.history_rebuild(T0)
    rebuilt = await _rows(store)
    assert {k[0] for k in rebuilt} == set(EXECUTION_LEVELS_US)
    assert any(k[5] == "hubspot-eu" for k in rebuilt)

    async def seqload(tx: SqlTx) -> None:
        for sql in rollup_statements(T0, T0 + 10 * 60_000_000):
            await tx.execute(sql)

    await store.db.transact(seqload, name="test.seqload_rollup", write=True)
    assert await _rows(store) == rebuilt


async def finish_effects_later(store: WorkStore) -> None:
    """Noop items in a later five minutes of the same hour."""
    await enqueue(store, 2, now=T0 + 7 * 60_000_000)
    for item in (await claim(store, now=T0 + 7 * 60_000_000, limit=2)).claimed:
        assert (await finalize(store, item, Succeeded(), now=T0 + 7 * 60_000_000)).applied


async def _rows(store: WorkStore) -> dict[tuple[object, ...], int]:
    async def body(tx: SqlTx) -> dict[tuple[object, ...], int]:
        rows = await tx.fetchall(
            "SELECT level_us, bucket_us, family, outcome, org_id, binding_id, operation,"
            " SUM(executions) FROM history_rollup GROUP BY level_us, bucket_us, family,"
            " outcome, org_id, binding_id, operation")
        return {tuple(r[:7]): int(r[7]) for r in rows}

    return await store.db.transact(body, name="test.rows", write=False)
