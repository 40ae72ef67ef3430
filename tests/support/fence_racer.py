"""A separate OS process that claims as fast as it can while a rollback fence runs:
``python -m tests.support.fence_racer URL FAMILY``.

It claims one item per write transaction (no plain-read probe first, so each
claim is one short transaction: select, conditional UPDATE, read back, COMMIT),
holds whatever it wins (a long lease: the row stays ``processing``), and stops
when its stdin closes. It prints one JSON line: how many items it won.
"""

from __future__ import annotations

import json
import sys
import time

import trio

from storage.open import open_store
from storage.port import ClaimParams


async def race(url: str, family: str) -> None:
    store = await open_store(url, pool_size=1, sqlite_synchronous="NORMAL")
    won = 0

    async def claim_forever() -> None:
        nonlocal won
        while True:
            result = await store.work_claim(
                ClaimParams(family=family, owner="racer", limit=1,
                            lease_ttl_us=3_600_000_000, window=2, probe_first=False),
                time.time_ns() // 1000,
            )
            won += len(result.claimed)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(claim_forever)
        sys.stdout.write(json.dumps({"ready": True}) + "\n")
        sys.stdout.flush()
        stdin = trio.lowlevel.FdStream(0)
        while await stdin.receive_some(64):
            pass
        nursery.cancel_scope.cancel()
    await store.db.aclose()
    sys.stdout.write(json.dumps({"won": won}) + "\n")


if __name__ == "__main__":
    trio.run(race, sys.argv[1], sys.argv[2])
