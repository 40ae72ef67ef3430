"""Rollback and re-cutover as a real process, step by step, for the SIGKILL matrix:
``python -m tests.support.cutover_driver URL FAMILY PAUSE``.

Each step looks at the database first and does only what is left (the
job: roll generation 1 back, then cut over again), so a run
killed anywhere can be run again to completion: rollback begin, the rollback
fence, the legacy owner's drain (its terminal transitions write the receipts),
the projector, begin, commit. With PAUSE=1 it prints ``{"done": k}`` after step
k and waits for a line on stdin before the next (so a test can SIGKILL it
exactly between two steps).
"""

from __future__ import annotations

import json
import sys
import time

import trio

from daemon.core.cutover import Phase
from sandbox.legacy import store as legacy
from storage.cutover.values import StepParams
from storage.open import open_store
from storage.work_store import WorkStore
from tests.support.legacy import sandbox_claimant

STEPS = ("rollback_begin", "rollback_commit", "legacy_drain", "project", "begin", "commit")


def _now_us() -> int:
    return time.time_ns() // 1000


async def _phase(store: WorkStore, family: str) -> tuple[Phase | None, int]:
    gen = await store.owner_generation_get(family)
    return (gen.phase, gen.generation) if gen is not None else (None, 0)


async def run_step(store: WorkStore, family: str, name: str) -> None:
    params = StepParams(family=family, actor="driver", reason="fault matrix",
                        claim_tx_bound_us=0)
    phase, generation = await _phase(store, family)
    # One rollback from generation 1, one re-cutover: a run again finishes the job.
    if name == "rollback_begin" and phase is Phase.INTEGRATIOND_ACTIVE and generation == 1:
        await store.cutover_rollback_begin(params, _now_us())
    elif name == "rollback_commit" and phase is Phase.ROLLBACK_DRAINING:
        await store.cutover_rollback_commit(params, _now_us())
    elif name == "legacy_drain" and phase is Phase.LEGACY_ACTIVE:
        while (ev := await legacy.claim_one(store, family, "legacy-d", 10**9,
                                            _now_us())) is not None:
            await legacy.finish(store, ev, "legacy-d", "succeeded", _now_us())
    elif name == "project":
        while (await store.legacy_project(_now_us())).projected:
            pass
    elif name == "begin" and phase is Phase.LEGACY_ACTIVE:
        await store.cutover_begin(params, _now_us())
    elif name == "commit" and phase is Phase.CUTOVER_DRAINING:
        await store.cutover_commit(params, _now_us(), sandbox_claimant())


async def main(url: str, family: str, pause: bool) -> None:
    store = await open_store(url, pool_size=1, sqlite_synchronous="NORMAL")
    stdin = trio.lowlevel.FdStream(0) if pause else None
    try:
        for k, name in enumerate(STEPS):
            await run_step(store, family, name)
            if stdin is not None:
                sys.stdout.write(json.dumps({"done": k}) + "\n")
                sys.stdout.flush()
                await stdin.receive_some(64)
    finally:
        await store.db.aclose()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3] == "1")
