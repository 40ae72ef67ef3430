"""The queue-pressure sampler as replicas run it (daemon/services/pressure_history.py):
two replicas over one database write one sample a minute between them, every minute,
with no database error; the samples count the queue as it is. Real SQLite, trio's
MockClock (autojump)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from daemon.core.pressure_sample import MINUTE_US, offset_us
from daemon.services.clock import TrioClock
from daemon.services.metrics import Metrics
from daemon.services.pressure_history import run_pressure_sampler
from storage.history import BUCKET_US
from storage.history_pressure import ALL, READY
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import fresh_database
from tests.support.work import enqueue


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[WorkStore]:
    """SQLite (MockClock's autojump would expire a MariaDB connect timeout); the
    sample's SQL is covered on every backend by tests/storage/test_history_pressure.py."""
    async with fresh_database("sqlite", tmp_path) as tdb:
        yield await tdb.open_store()


async def test_two_replicas_sample_every_minute_once_between_them(
        store: WorkStore, autojump_clock: object) -> None:
    clock = TrioClock()
    start = clock.now_us()
    await enqueue(store, 3, now=start)
    metrics = [Metrics(), Metrics()]
    async with trio.open_nursery() as nursery:
        for replica, m in zip(("replica-a", "replica-b"), metrics, strict=True):
            await nursery.start(run_pressure_sampler, store, clock, m, replica)
        await trio.sleep(5 * 60 + 45)
        nursery.cancel_scope.cancel()

    async def body(tx: SqlTx) -> list[tuple[int, int]]:
        rows = await tx.fetchall(
            "SELECT bucket_us, n FROM history_pressure WHERE level_us = ? AND family = ?"
            " AND series = ? ORDER BY bucket_us", (BUCKET_US, ALL, READY))
        return [(int(b), int(n)) for b, n in rows]

    samples = await store.db.transact(body, name="test.samples", write=False)
    # 5 min 45 s: the first minute (or the next, by where the replicas' offsets fall)
    # and every one after it, none missed, each written once (the primary key).
    buckets = [b for b, _ in samples]
    assert len(buckets) >= 5, samples
    assert buckets == list(range(buckets[0], buckets[0] + len(buckets) * MINUTE_US,
                                 MINUTE_US))
    assert buckets[0] - start < MINUTE_US + min(offset_us("replica-a"),
                                                offset_us("replica-b")) + 5_000_000
    assert all(n == 3 for _, n in samples)
    for m in metrics:
        assert m.db_errors.labels("pressure_sample")._value.get() == 0
