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
    procs = [
        await trio.lowlevel.open_process(
            # On Galera each process connects to the next node.
            [sys.executable, "-m", "tests.support.claim_racer", database.next_url(), f"P{i}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        for i in range(PROCESSES)
    ]
    outputs = []
    with trio.fail_after(120):
        # Every racer connected before any claims: they start together however late the
        # machine started each one.
        seen = [b"" for _ in procs]
        for n, proc in enumerate(procs):
            assert proc.stdout is not None
            while b"\n" not in seen[n]:
                chunk = await proc.stdout.receive_some(65536)
                assert chunk, f"racer {n} exited before it was ready"
                seen[n] += chunk
            assert seen[n].startswith(b"ready\n"), seen[n]
        for proc in procs:
            assert proc.stdin is not None
            await proc.stdin.send_all(b"go\n")
        for n, proc in enumerate(procs):
            assert proc.stdout is not None
            data = seen[n].removeprefix(b"ready\n")
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
