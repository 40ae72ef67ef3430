"""Conformance: the work queue's pressure history (storage/history_pressure.py) samples
ready, waiting (retry backoff, held) and claimed items per family from the WorkItems,
one sample a minute cluster-wide (Galera: two stores on two nodes, the second sampler of
a minute writes nothing), hour and day rows hold the highest sample, and a rebuild of
them from the minute rows gives the same rows (issue 23 item 1)."""

from __future__ import annotations

import pytest

from daemon.core.outcomes import RetryLater
from storage import history_pressure
from storage.history import BUCKET_US, DAY_US, HOUR_US, bucket_of
from storage.history_pressure import (
    ALL,
    CLAIMED,
    HELD,
    READY,
    RETRY_WAIT,
    PressureCount,
    PressurePoint,
)
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import SEC, T0, claim, enqueue, finalize

M0 = bucket_of(T0)


async def _rows(store: WorkStore) -> dict[tuple[int, int, str, str], tuple[int, int]]:
    async def body(tx: SqlTx) -> dict[tuple[int, int, str, str], tuple[int, int]]:
        rows = await tx.fetchall(
            "SELECT level_us, bucket_us, family, series, n, more FROM history_pressure")
        return {(int(lv), int(b), str(f), str(s)): (int(n), int(m))
                for lv, b, f, s, n, m in rows}

    return await store.db.transact(body, name="test.pressure_rows", write=False)


async def _queue(store: WorkStore) -> None:
    """noop: 3 ready, 1 held (due in an hour), 1 claimed, 1 in a retry's backoff; other:
    2 ready."""
    await enqueue(store, 5)
    await enqueue(store, 1, run_after_us=T0 + 3600 * SEC)
    await enqueue(store, 2, family="other")
    first, second = (await claim(store, "A", limit=2)).claimed
    assert (await finalize(store, first, RetryLater("slow", delay_s=300.0))).applied
    assert second.state.value == "processing"


async def test_a_sample_counts_the_queue_once_a_minute_cluster_wide(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await _queue(a)
    counts = await a.history_pressure_sample(T0 + 10 * SEC)
    assert counts is not None
    assert sorted(counts, key=lambda c: (c.family, c.series)) == [
        PressureCount(ALL, CLAIMED, 1), PressureCount(ALL, HELD, 1),
        PressureCount(ALL, READY, 5), PressureCount(ALL, RETRY_WAIT, 1),
        PressureCount("noop", CLAIMED, 1), PressureCount("noop", HELD, 1),
        PressureCount("noop", READY, 3), PressureCount("noop", RETRY_WAIT, 1),
        PressureCount("other", READY, 2)]
    # The other node's sampler, later in the same minute, finds the minute taken.
    await enqueue(b, 4, family="other")
    assert await b.history_pressure_sampled(M0)
    assert await b.history_pressure_sample(T0 + 30 * SEC) is None
    rows = await _rows(a)
    assert rows[(BUCKET_US, M0, "other", READY)] == (2, 0)
    assert rows[(BUCKET_US, M0, ALL, READY)] == (5, 0)
    # The next minute: the retry is still backing off, 4 more are ready.
    assert await b.history_pressure_sample(T0 + 70 * SEC) is not None
    rows = await _rows(a)
    assert rows[(BUCKET_US, M0 + BUCKET_US, ALL, READY)] == (9, 0)
    # Hour and day rows: the highest sample; zeros are written for '*' only.
    for level in (HOUR_US, DAY_US):
        assert rows[(level, bucket_of(M0, level), ALL, READY)] == (9, 0)
        assert rows[(level, bucket_of(M0, level), "other", READY)] == (6, 0)
        assert rows[(level, bucket_of(M0, level), "noop", CLAIMED)] == (1, 0)
    assert (BUCKET_US, M0, "other", CLAIMED) not in rows
    assert rows[(BUCKET_US, M0, ALL, CLAIMED)] == (1, 0)


async def test_reads_give_the_highest_sample_per_step_and_gaps_where_none(
        store: WorkStore) -> None:
    await _queue(store)
    await store.history_pressure_sample(T0)
    await enqueue(store, 10)
    await store.history_pressure_sample(T0 + 2 * BUCKET_US)  # minute 1: not sampled
    per_minute = await store.history_pressure(M0, M0 + 3 * BUCKET_US, BUCKET_US, "noop")
    ready = {(p.at_us, p.family): p.n for p in per_minute if p.series == READY}
    assert ready == {(M0, ALL): 5, (M0, "noop"): 3,
                     (M0 + 2 * BUCKET_US, ALL): 15, (M0 + 2 * BUCKET_US, "noop"): 13}
    # A step of 5 minutes: the highest sample; all families read the '*' rows only.
    (step,) = {p.at_us for p in await store.history_pressure(
        M0, M0 + 5 * BUCKET_US, 5 * BUCKET_US)}
    assert step == M0 - M0 % (5 * BUCKET_US)
    per_hour = await store.history_pressure(M0, M0 + HOUR_US, HOUR_US, None)
    assert {p.family for p in per_hour} == {ALL}
    assert PressurePoint(bucket_of(M0, HOUR_US), ALL, READY, 15, False) in per_hour


async def test_a_rebuild_of_the_peaks_from_the_samples_equals_the_maintained_rows(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await _queue(a)
    await a.history_pressure_sample(T0)
    await enqueue(b, 3, family="other")
    await b.history_pressure_sample(T0 + BUCKET_US)
    await b.history_pressure_sample(T0 + DAY_US)  # a second day
    maintained = await _rows(a)

    async def damage(tx: SqlTx) -> None:
        await tx.execute("UPDATE history_pressure SET n = n + 40 WHERE level_us <> ?",
                         (BUCKET_US,))
        await tx.execute("DELETE FROM history_pressure WHERE level_us = ? AND family = ?",
                         (DAY_US, "other"))

    await a.db.transact(damage, name="test.damage", write=True)
    assert await _rows(a) != maintained
    assert await b.history_pressure_rebuild() > 0
    assert await _rows(a) == maintained


async def test_a_capped_count_says_more(store: WorkStore,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history_pressure, "COUNT_CAP", 2)
    await _queue(store)
    counts = await store.history_pressure_sample(T0)
    assert counts is not None
    by = {(c.family, c.series): c for c in counts}
    assert by[("noop", READY)] == PressureCount("noop", READY, 2, True)
    assert by[(ALL, READY)] == PressureCount(ALL, READY, 4, True)
    assert by[("other", READY)] == PressureCount("other", READY, 2, False)
