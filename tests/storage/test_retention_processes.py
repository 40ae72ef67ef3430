"""Retention across real OS processes: one pruner at a time; a kill mid-batch is harmless.

Pruners are separate processes (``tests.support.retention_runner``) on the same
database. Two running at once never prune at the same time (their pruning passes'
wall-clock intervals never overlap) and together delete each old row once. A pruner
SIGKILLed while it prunes leaves whole batches only: its stored scan cursor and its
deletions committed together, live work is intact, and once its lease expires another
pruner takes over and finishes.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time

import pytest
import trio

from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.retention import PAST_WORK, count, prune
from tests.support.work import claim, enqueue, finalize

OLD_ITEMS = 300


async def _seed(store: WorkStore) -> list[str]:
    """``OLD_ITEMS`` terminal items (one execution each) and three live ones."""
    from daemon.core.outcomes import RetryLater, Succeeded

    for lane in range(OLD_ITEMS // 50):
        await enqueue(store, 50, subject_id=f"s{lane}")
    done = 0
    while done < OLD_ITEMS:
        for item in (await claim(store, limit=100)).claimed:
            await finalize(store, item, Succeeded())
            done += 1
    live = await enqueue(store, 3, subject_id="live")
    for item in (await claim(store, limit=1)).claimed:
        await finalize(store, item, RetryLater("flaky"))
    return live


def _runner(database: FreshDatabase, holder: str, passes: int,
            start_at: float) -> list[str]:
    return [sys.executable, "-m", "tests.support.retention_runner", database.url, holder,
            str(PAST_WORK), str(passes), str(start_at)]


async def _lines(proc: trio.Process) -> list[dict[str, object]]:
    assert proc.stdout is not None
    data = b""
    while chunk := await proc.stdout.receive_some(65536):
        data += chunk
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


@pytest.mark.slow
async def test_two_pruner_processes_never_prune_at_once(
    database: FreshDatabase, store: WorkStore,
) -> None:
    live = await _seed(store)
    start_at = time.time() + 1.5
    procs = [await trio.lowlevel.open_process(_runner(database, f"P{i}", 6, start_at),
                                              stdout=subprocess.PIPE) for i in range(2)]
    outputs: list[dict[str, object]] = []
    with trio.fail_after(120):
        for proc in procs:
            outputs += await _lines(proc)
            assert await proc.wait() == 0
    ran = [o for o in outputs if o["result"] != "busy"]
    assert all(o["result"] == "done" for o in ran), ran
    ran.sort(key=lambda o: float(o["t0"]))  # type: ignore[arg-type]
    for before, after in itertools.pairwise(ran):
        assert float(after["t0"]) >= float(before["t1"]), (before, after)  # type: ignore[arg-type]
    assert sum(int(o["pruned"]) for o in outputs) == 2 * OLD_ITEMS  # type: ignore[call-overload]
    assert await count(store, "work_items") == 3
    assert {(await store.work_get(w)) is not None for w in live} == {True}
    assert await count(store, "work_executions") == 1  # the live item's


@pytest.mark.slow
async def test_a_pruner_killed_mid_batch_leaves_whole_batches(
    database: FreshDatabase, store: WorkStore,
) -> None:
    live = await _seed(store)
    proc = await trio.lowlevel.open_process(_runner(database, "doomed", 0, 0.0),
                                            stdout=subprocess.PIPE)
    try:
        with trio.fail_after(60):
            while await count(store, "work_items") > OLD_ITEMS * 2 // 3:  # noqa: ASYNC110
                await trio.sleep(0.005)  # (another process's progress: nothing to wait on)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        if proc.stdout is not None:
            await proc.stdout.aclose()
    remaining = await count(store, "work_items")
    assert 3 < remaining < OLD_ITEMS + 3, "killed while it was pruning"
    status = await store.retention_status()
    assert status is not None and status.holder == "doomed"  # it died holding the lease

    # Whole batches: everything before the committed cursor of the scan is gone, and
    # nothing at all past the point the scan had reached.
    async def cursors(tx: object) -> dict[str, list[object]]:
        rows = await tx.fetchall(  # type: ignore[attr-defined]
            "SELECT cursors_json FROM retention_leases WHERE name = 'retention'")
        return dict(json.loads(str(rows[0][0])))

    cursor = (await store.db.transact(cursors, name="t", write=False)).get(
        "work_items:succeeded")
    if cursor is not None:
        assert await count(store, "work_items", "state = 'succeeded' AND work_id <= ?",
                           (cursor[0],)) == 0
        assert await count(store, "work_items", "state = 'succeeded' AND work_id > ?",
                           (cursor[0],)) == remaining - 3
    assert {(await store.work_get(w)) is not None for w in live} == {True}
    # Another pruner cannot take over before the dead one's lease expires...
    early = await prune_or_busy(store, PAST_WORK + 1)
    assert early is None
    # ...and finishes the job after it.
    await prune(store, PAST_WORK + 61 * 1_000_000, holder="heir")
    assert await count(store, "work_items") == 3
    assert {(await store.work_get(w)) is not None for w in live} == {True}


async def prune_or_busy(store: WorkStore, now_us: int) -> object:
    from tests.support.retention import pruner

    return await pruner(store, now_us, holder="early").pass_once()
