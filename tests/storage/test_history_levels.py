"""history_rollup's five-minute and six-hour levels (migration 0049, issue 23 item 1):
maintained by the journaling transaction's one conditional UPDATE (storage/rollup_rows.py)
beside the minute, hour and day rows, backfilled from the minute and hour rows by the
migration, equal to a rebuild, and read by a step that tiles them (a 6 h range's
5-minute step read five times as many minute rows before, a 30-day range's 6-hour step
six times as many hour rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.core.outcomes import Succeeded
from storage.history import (
    BUCKET_US,
    DAY_US,
    EXECUTION_LEVELS_US,
    FIVE_MIN_US,
    HOUR_US,
    LEVELS_US,
    SIX_HOURS_US,
    HistoryPoint,
    bucket_of,
    level_for,
    step_range,
)
from storage.migrate import EXPECTED_VERSION, migrate
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, backend_params, fresh_database
from tests.support.history import RollupKey, finish_effects, rollup_rows
from tests.support.work import SEC, T0, claim, enqueue, finalize

MIN = BUCKET_US
FIVE = 300_000_000

# (step, levels, level read): the coarsest level that tiles the step.
LEVEL_ROWS = [
    (1 * MIN, EXECUTION_LEVELS_US, MIN),
    (2 * MIN, EXECUTION_LEVELS_US, MIN),
    (3 * MIN, EXECUTION_LEVELS_US, MIN),
    (5 * MIN, EXECUTION_LEVELS_US, FIVE),  # 6 h
    (10 * MIN, EXECUTION_LEVELS_US, FIVE),  # up to 20 h
    (15 * MIN, EXECUTION_LEVELS_US, FIVE),
    (60 * MIN, EXECUTION_LEVELS_US, HOUR_US),
    (90 * MIN, EXECUTION_LEVELS_US, FIVE),
    (120 * MIN, EXECUTION_LEVELS_US, HOUR_US),  # 7 d
    (180 * MIN, EXECUTION_LEVELS_US, HOUR_US),
    (360 * MIN, EXECUTION_LEVELS_US, SIX_HOURS_US),  # custom 30 d
    (720 * MIN, EXECUTION_LEVELS_US, SIX_HOURS_US),  # custom 60 d
    (1080 * MIN, EXECUTION_LEVELS_US, SIX_HOURS_US),
    (1440 * MIN, EXECUTION_LEVELS_US, DAY_US),
    (3 * 1440 * MIN, EXECUTION_LEVELS_US, DAY_US),
    # history_flow and history_quota keep three levels: no five-minute rows to read.
    (5 * MIN, LEVELS_US, MIN),
    (10 * MIN, LEVELS_US, MIN),
    (60 * MIN, LEVELS_US, HOUR_US),
    (360 * MIN, LEVELS_US, HOUR_US),
]


@pytest.mark.parametrize(("step", "levels", "level"), LEVEL_ROWS)
def test_the_coarsest_level_that_tiles_the_step_is_read(
        step: int, levels: tuple[int, ...], level: int) -> None:
    assert level_for(step, levels) == level
    _, args = step_range(T0 + 7 * MIN, T0 + 9 * HOUR_US, step, "family", None, levels)
    assert args[:3] == (step, level, bucket_of(T0 + 7 * MIN, level))


@pytest.mark.parametrize("step", [0, -MIN, 30 * SEC, MIN + SEC, 5 * MIN + 1])
def test_a_step_that_is_not_whole_minutes_is_refused(step: int) -> None:
    with pytest.raises(ValueError, match="multiple of a minute"):
        step_range(T0, T0 + HOUR_US, step, "family", None, EXECUTION_LEVELS_US)


def _summed(rows: dict[RollupKey, int], level: int) -> dict[RollupKey, int]:
    """The minute rows summed to ``level``'s buckets."""
    out: dict[RollupKey, int] = {}
    for key, n in rows.items():
        if key[0] == MIN:
            at = (level, bucket_of(key[1], level), *key[2:])
            out[at] = out.get(at, 0) + n
    return out


def _level(rows: dict[RollupKey, int], level: int) -> dict[RollupKey, int]:
    return {k: n for k, n in rows.items() if k[0] == level}


async def _noops(store: WorkStore, at: int, n: int) -> None:
    await enqueue(store, n, now=at)
    for item in (await claim(store, now=at, limit=n)).claimed:
        assert (await finalize(store, item, Succeeded(), now=at)).applied


async def test_the_five_minute_rows_are_maintained_and_read(database: FreshDatabase) -> None:
    assert T0 % FIVE_MIN_US == 0
    a, b = await database.open_store(), await database.open_store()
    await finish_effects(a, T0)  # keyed effect items and a noop, minute 0
    await _noops(b, T0 + 3 * MIN, 2)  # a new minute of an existing five minutes
    await _noops(a, T0 + 6 * MIN, 3)  # a new five minutes
    await _noops(b, T0 + 6 * MIN + SEC, 1)  # the steady state: every level's row exists
    rows = await rollup_rows(a)
    five = _level(rows, FIVE)
    assert five == _summed(rows, FIVE)
    assert five[(FIVE, T0, "noop", "succeeded", "", "", "")] == 3
    assert five[(FIVE, T0 + FIVE, "noop", "succeeded", "", "", "")] == 4
    assert sum(n for k, n in five.items() if k[2] == "external_effect") == 5
    for level in (HOUR_US, SIX_HOURS_US, DAY_US):  # every execution once at each level
        assert _level(rows, level) == _summed(rows, level)

    # A step of five or ten minutes reads the five-minute rows, not the minutes: minute
    # rows made wrong do not move it (before 0049 a 5-minute step summed minutes).
    expected = [HistoryPoint(T0, "external_effect", "dead", 2),
                HistoryPoint(T0, "external_effect", "succeeded", 3),
                HistoryPoint(T0, "noop", "succeeded", 3),
                HistoryPoint(T0 + FIVE, "noop", "succeeded", 4)]
    assert await b.history_outcomes(T0, T0 + 2 * FIVE, FIVE) == expected

    async def damage(tx: SqlTx) -> None:
        await tx.execute("UPDATE history_rollup SET executions = executions + 100"
                         " WHERE level_us = ?", (MIN,))

    await a.db.transact(damage, name="test.damage", write=True)
    assert await b.history_outcomes(T0, T0 + 2 * FIVE, FIVE) == expected
    ten = await b.history_outcomes(T0, T0 + 2 * FIVE, 2 * FIVE)
    assert [(p.family, p.outcome, p.executions) for p in ten] == [
        ("external_effect", "dead", 2), ("external_effect", "succeeded", 3),
        ("noop", "succeeded", 7)]
    assert (await b.history_outcomes(T0, T0 + MIN, MIN))[0].executions > 100

    # A rebuild writes the five-minute level too, equal to the maintained rows.
    assert await a.history_rebuild(T0) > 0
    assert await rollup_rows(b) == rows


FIVE_MINUTES = 49


# The backfill's SQL differs per dialect, not between MariaDB and Galera (CI time).
@pytest.mark.parametrize("backend", backend_params(["sqlite", "mysql"]))
async def test_the_migration_backfills_five_minutes_from_the_minute_rows(
        backend: str, tmp_path: Path) -> None:
    assert EXPECTED_VERSION >= FIVE_MINUTES
    async with fresh_database(backend, tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()
        await migrate(store.db, store.dialect, T0, upto=FIVE_MINUTES - 1)
        minute = ("INSERT INTO history_rollup (level_us, bucket_us, family, outcome,"
                  " org_id, binding_id, operation, shard, executions)"
                  " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
        old = [  # minute rows as 0048's writer left them, with their hour and day rows
            (MIN, T0, "external_effect", "dead", "org-1", "b-1", "op", 0, 2),
            (MIN, T0 + 4 * MIN, "external_effect", "dead", "org-1", "b-1", "op", 0, 3),
            (MIN, T0 + 4 * MIN, "external_effect", "dead", "org-1", "b-1", "op", 2, 7),
            (MIN, T0 + 4 * MIN, "external_effect", "dead", "org-2", "b-1", "op", 0, 1),
            (MIN, T0 + 5 * MIN, "noop", "succeeded", "", "", "", 1, 4),
            (MIN, T0 + 59 * MIN, "noop", "succeeded", "", "", "", 1, 6),
        ]
        old.append((MIN, T0 + 7 * HOUR_US, "noop", "dead", "", "", "", 0, 9))
        coarse: dict[tuple[object, ...], int] = {}
        for level in (HOUR_US, DAY_US):
            for row in old:
                key = (level, bucket_of(int(row[1]), level), *row[2:8])
                coarse[key] = coarse.get(key, 0) + int(row[8])

        async def old_build(tx: SqlTx) -> None:
            await tx.executemany(minute, [*old, *((*k, n) for k, n in coarse.items())])

        await store.db.transact(old_build, name="test.old_rows")
        before = await rollup_rows(store)
        assert not _level(before, FIVE) and not _level(before, SIX_HOURS_US)
        assert await migrate(store.db, store.dialect, T0, upto=FIVE_MINUTES) == [FIVE_MINUTES]
        after = await rollup_rows(store)
        assert after == {**before, **_summed(before, FIVE), **_summed(before, SIX_HOURS_US)}
        six = bucket_of(T0, SIX_HOURS_US)
        assert six <= T0 < T0 + 59 * MIN < six + SIX_HOURS_US <= T0 + 7 * HOUR_US
        assert _level(after, SIX_HOURS_US) == {
            (SIX_HOURS_US, six, "external_effect", "dead", "org-1", "b-1", "op"): 12,
            (SIX_HOURS_US, six, "external_effect", "dead", "org-2", "b-1", "op"): 1,
            (SIX_HOURS_US, six, "noop", "succeeded", "", "", ""): 10,
            (SIX_HOURS_US, six + SIX_HOURS_US, "noop", "dead", "", "", ""): 9,
        }
        assert _level(after, FIVE) == {
            (FIVE, T0, "external_effect", "dead", "org-1", "b-1", "op"): 12,
            (FIVE, T0, "external_effect", "dead", "org-2", "b-1", "op"): 1,
            (FIVE, T0 + FIVE, "noop", "succeeded", "", "", ""): 4,
            (FIVE, T0 + 55 * MIN, "noop", "succeeded", "", "", ""): 6,
            (FIVE, T0 + 7 * HOUR_US, "noop", "dead", "", "", ""): 9,
        }

        async def shards(tx: SqlTx) -> set[int]:  # each shard's rows summed on their own
            return {int(s) for (s,) in await tx.fetchall(
                "SELECT shard FROM history_rollup WHERE level_us = ? AND org_id = 'org-1'",
                (FIVE,))}

        assert await store.db.transact(shards, name="test.shards", write=False) == {0, 2}
        # A 6 h range's 5-minute step reads the backfilled rows: the same counts as the
        # minutes it replaced.
        assert await store.history_outcomes(T0, T0 + HOUR_US, FIVE) == [
            HistoryPoint(T0, "external_effect", "dead", 13),
            HistoryPoint(T0 + FIVE, "noop", "succeeded", 4),
            HistoryPoint(T0 + 55 * MIN, "noop", "succeeded", 6)]
        # A 6-hour step reads the six-hour rows: the hours they replaced.
        assert await store.history_outcomes(six, six + 2 * SIX_HOURS_US, SIX_HOURS_US) == [
            HistoryPoint(six, "external_effect", "dead", 13),
            HistoryPoint(six, "noop", "succeeded", 10),
            HistoryPoint(six + SIX_HOURS_US, "noop", "dead", 9)]
