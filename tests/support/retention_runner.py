"""A pruner in its own OS process: ``python -m tests.support.retention_runner``.

Arguments: storage URL, holder name, the fixed "now" (epoch us) its clock reads, the
number of passes to run (0: until killed), the wall time to start at. Each pass prints
one JSON line: result, rows pruned, and the wall-clock interval its batches ran in
(from the first batch's call to the last batch's return; a batch needs the lease).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

import trio

from storage.open import open_store
from storage.retention.prune import BatchParams, BatchResult
from tests.support.retention import pruner


async def main(url: str, holder: str, now_us: int, passes: int, start_at: float) -> None:
    store = await open_store(url, pool_size=1, sqlite_synchronous="NORMAL")
    worker = pruner(store, now_us, holder=holder, batch_rows=5)
    spans: list[float] = []
    batch = store.retention_prune_batch

    async def timed(params: BatchParams, now: Callable[[], int]) -> BatchResult:
        spans.append(time.time())
        try:
            return await batch(params, now)
        finally:
            spans.append(time.time())

    store.retention_prune_batch = timed  # type: ignore[method-assign]
    await trio.sleep(max(0.0, start_at - time.time()))
    done = 0
    while passes == 0 or done < passes:
        spans.clear()
        summary = await worker.pass_once()
        t0, t1 = (spans[0], spans[-1]) if spans else (0.0, 0.0)
        pruned = 0 if summary is None else sum(
            int(t["pruned"]) for t in summary["tables"].values())
        result = "busy" if summary is None else summary["result"]
        sys.stdout.write(json.dumps({"holder": holder, "result": result, "pruned": pruned,
                                     "t0": t0, "t1": t1}) + "\n")
        sys.stdout.flush()
        done += 1
        await trio.sleep(0.01)
    await store.db.aclose()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
             float(sys.argv[5]))
