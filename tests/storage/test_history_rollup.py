"""Conformance: the console's history rollup (storage/history.py) counts every journaled
execution once, in the journaling transaction, on every backend (Galera: two stores on two
nodes), and a rebuild from the journal rows gives the same counts (issue 23 item 1)."""

from __future__ import annotations

from daemon.core.outcomes import DeadLetter, RetryLater, Succeeded
from storage.history import BUCKET_US, DAY_US, HOUR_US, HistoryPoint, bucket_of
from storage.port import SqlTx
from storage.work_executions import journal, journal_entry
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import SEC, T0, claim, enqueue, finalize

M0 = bucket_of(T0)
M1 = M0 + BUCKET_US


async def _rollup(store: WorkStore, level: int | None = BUCKET_US
                  ) -> dict[tuple[int, str, str], int]:
    """One level of the rollup (None: every level, the level added to the bucket) summed
    over shards (what every reader sees)."""

    async def body(tx: SqlTx) -> dict[tuple[int, str, str], int]:
        rows = await tx.fetchall(
            "SELECT level_us, bucket_us, family, outcome, SUM(executions) FROM history_rollup"
            " GROUP BY level_us, bucket_us, family, outcome")
        return {(int(b) + (int(lv) if level is None else 0), str(f), str(o)): int(n)
                for lv, b, f, o, n in rows if level is None or int(lv) == level}

    return await store.db.transact(body, name="test.rollup", write=False)


async def _finish_some(a: WorkStore, b: WorkStore) -> None:
    """Minute 0: A succeeds 2, B fails 1 for retry; minute 1: B succeeds the retry, A sends
    1 ``doomed`` item dead, B reclaims 2 leases A lost, B succeeds 1 ``other`` item."""
    await enqueue(a, 2)
    for item in (await claim(a, "A", limit=2)).claimed:
        assert (await finalize(a, item, Succeeded(), replica="A")).applied
    await enqueue(b, 1)
    (retry,) = (await claim(b, "B", limit=1)).claimed
    assert (await finalize(b, retry, RetryLater("slow", delay_s=1.0), replica="B")).applied
    later = M1 + 5 * SEC
    (again,) = (await claim(b, "B", limit=1, now=later)).claimed
    assert again.work_id == retry.work_id
    assert (await finalize(b, again, Succeeded(), now=later, replica="B")).applied
    await enqueue(a, 1, now=later, family="doomed", max_attempts=1)
    (doomed,) = (await claim(a, "A", family="doomed", now=later)).claimed
    assert (await finalize(a, doomed, DeadLetter("nope"), now=later, replica="A")).applied
    await enqueue(a, 2, now=later)
    assert len((await claim(a, "A", limit=10, now=later, ttl=SEC)).claimed) == 2
    assert len((await claim(b, "B", limit=10, now=later + 2 * SEC)).reclaimed) == 2
    await enqueue(b, 1, now=later, family="other")
    (other,) = (await claim(b, "B", family="other", now=later)).claimed
    assert (await finalize(b, other, Succeeded(), now=later, replica="B")).applied


async def test_every_journaled_execution_is_counted_once_in_its_minute(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await _finish_some(a, b)
    counts = await _rollup(a)
    assert counts == {
        (M0, "noop", "succeeded"): 2, (M0, "noop", "retry"): 1,
        (M1, "noop", "succeeded"): 1, (M1, "doomed", "dead"): 1,
        (M1, "noop", "lease_lost"): 2, (M1, "other", "succeeded"): 1,
    }
    # The hour and the day hold the same counts (both minutes are in one hour).
    coarse = {(M0 - M0 % HOUR_US, "noop", "succeeded"): 3, (M0 - M0 % HOUR_US, "noop", "retry"): 1,
              (M0 - M0 % HOUR_US, "doomed", "dead"): 1,
              (M0 - M0 % HOUR_US, "noop", "lease_lost"): 2,
              (M0 - M0 % HOUR_US, "other", "succeeded"): 1}
    assert await _rollup(a, HOUR_US) == coarse
    assert await _rollup(a, DAY_US) == {(b - b % DAY_US, f, o): n
                                        for (b, f, o), n in coarse.items()}
    # A step of hours reads the hour rows.
    assert await b.history_outcomes(M0, M0 + DAY_US, 2 * HOUR_US, "other") == [
        HistoryPoint(M0 - M0 % (2 * HOUR_US), "other", "succeeded", 1)]
    # The reads: per step (T0 opens an even minute: both minutes are one 2-minute step),
    # per family.
    assert M0 % (2 * BUCKET_US) == 0
    assert await b.history_outcomes(M0, M1 + BUCKET_US, 2 * BUCKET_US, "noop") == [
        HistoryPoint(M0, "noop", o, n)
        for o, n in (("lease_lost", 2), ("retry", 1), ("succeeded", 3))
    ]
    assert await b.history_outcomes(M1, M1 + BUCKET_US, BUCKET_US, "other") == [
        HistoryPoint(M1, "other", "succeeded", 1)]
    assert await b.history_outcomes(M1 + BUCKET_US, M1 + 9 * BUCKET_US, BUCKET_US) == []
    behind = await b.history_executions(M1, M1 + BUCKET_US, family="doomed", outcome="dead",
                                        limit=10)
    assert [(e.family, e.outcome, e.replica) for e in behind] == [("doomed", "dead", "A")]
    assert len(await b.history_executions(M0, M1, family=None, outcome=None, limit=10)) == 3


async def test_a_rebuild_from_the_rows_equals_the_maintained_rollup(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await _finish_some(a, b)
    maintained = await _rollup(a, None)
    later_day = M0 - M0 % DAY_US + 3 * DAY_US

    async def damage(tx: SqlTx) -> None:
        await tx.execute("UPDATE history_rollup SET executions = executions + 40")
        await tx.execute(
            "INSERT INTO history_rollup (level_us, bucket_us, family, outcome, shard,"
            " executions) VALUES (?, ?, 'noop', 'succeeded', 3, 7)", (BUCKET_US, later_day))

    await a.db.transact(damage, name="test.damage", write=True)
    assert await _rollup(a, None) != maintained
    assert await b.history_rebuild(T0) > 0
    rebuilt = await _rollup(a, None)
    # Days after the newest row are not the rows' to rebuild; the damaged one stays.
    assert rebuilt.pop((later_day + BUCKET_US, "noop", "succeeded")) == 7
    assert rebuilt == maintained


async def test_a_bucket_older_than_the_kept_rows_survives_a_rebuild(store: WorkStore) -> None:
    old = M0 - M0 % DAY_US - 2 * DAY_US

    async def seed(tx: SqlTx) -> None:
        await tx.execute(
            "INSERT INTO history_rollup (level_us, bucket_us, family, outcome, shard,"
            " executions) VALUES (?, ?, 'noop', 'succeeded', 0, 5)", (BUCKET_US, old))

    await store.db.transact(seed, name="test.seed", write=True)
    await enqueue(store)
    (item,) = (await claim(store, "A", now=T0)).claimed
    assert (await finalize(store, item, Succeeded())).applied
    assert await store.history_rebuild() == 0  # T0's day is not whole: left as counted
    assert await store.history_rebuild(T0) == 5  # from T0's day: each level's one row
    counts = await _rollup(store)
    assert counts[(old, "noop", "succeeded")] == 5  # retention removed its rows: kept
    assert counts[(M0, "noop", "succeeded")] == 1


async def test_a_repeated_journal_entry_is_not_counted_twice(store: WorkStore) -> None:
    entry = journal_entry("01JAAAAAAAAAAAAAAAAAAAAAAA", 1, "noop", 1, "A", "succeeded", T0)
    other = journal_entry("01JBBBBBBBBBBBBBBBBBBBBBBB", 1, "noop", 1, "A", "succeeded", T0)

    async def write(tx: SqlTx, entries: list[tuple[object, ...]]) -> None:
        await journal(tx, entries)

    await store.db.transact(lambda tx: write(tx, [entry]), name="test.j1", write=True)
    # A finalize repeated after an unknown COMMIT journals the same fact again.
    await store.db.transact(lambda tx: write(tx, [entry, other]), name="test.j2", write=True)
    assert await _rollup(store) == {(M0, "noop", "succeeded"): 2}
