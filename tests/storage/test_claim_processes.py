"""Conformance: concurrent claims from several OS processes have exactly one winner."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import trio

from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import enqueue

PROCESSES = 4
ITEMS = 300


@pytest.mark.slow
async def test_claims_across_processes_have_one_winner(
    database: FreshDatabase, store: WorkStore
) -> None:
    ids = []
    for lane in range(ITEMS // 50):
        ids += await enqueue(store, 50, now=time.time_ns() // 1000, subject_id=f"s{lane}")
    start_at = time.time() + 1.5  # every process is up and connected by then
    procs = [
        await trio.lowlevel.open_process(
            # On Galera each process connects to the next node.
            [sys.executable, "-m", "tests.support.claim_racer", database.next_url(), f"P{i}",
             str(start_at)],
            stdout=subprocess.PIPE,
        )
        for i in range(PROCESSES)
    ]
    outputs = []
    with trio.fail_after(120):
        for proc in procs:
            assert proc.stdout is not None
            data = b""
            while chunk := await proc.stdout.receive_some(65536):
                data += chunk
            assert await proc.wait() == 0
            outputs.append(json.loads(data))
    winners: dict[str, list[str]] = {}
    for out in outputs:
        for work_id, epoch in out["won"]:
            assert epoch == 1
            winners.setdefault(work_id, []).append(out["owner"])
    assert sorted(winners) == sorted(ids), f"every item claimed: {len(winners)} of {len(ids)}"
    doubles = {w: o for w, o in winners.items() if len(o) > 1}
    assert not doubles, f"items claimed by two processes: {doubles}"
    # Contention was real: more than one process won something.
    assert sum(1 for out in outputs if out["won"]) > 1
