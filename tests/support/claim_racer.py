"""A separate OS process that races for claims: ``python -m tests.support.claim_racer``.

Once connected it prints ``ready`` and waits for ``go`` on stdin (the test sends it
when every racer is ready: a start instant on the clock would leave a racer that a loaded
machine started late with nothing to race for), claims in small batches until nothing is
left, and prints one JSON line: the (work id, epoch) pairs it won.
"""

from __future__ import annotations

import json
import sys
import time

import trio

from storage.open import open_store
from storage.port import ClaimParams


async def race(url: str, owner: str) -> None:
    store = await open_store(url, pool_size=1, sqlite_synchronous="NORMAL")
    await store.db.ping()  # connected before it says so
    won: list[tuple[str, int]] = []
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    assert (await trio.to_thread.run_sync(sys.stdin.readline)).strip() == "go"
    idle = 0
    while idle < 3:
        result = await store.work_claim(
            ClaimParams(family="noop", owner=owner, limit=3, lease_ttl_us=600_000_000,
                        window=6),
            time.time_ns() // 1000,
        )
        won.extend((i.work_id, i.ownership_epoch) for i in result.claimed)
        idle = 0 if result.claimed or result.contended else idle + 1
    await store.db.aclose()
    sys.stdout.write(json.dumps({"owner": owner, "won": won}) + "\n")


if __name__ == "__main__":
    trio.run(race, sys.argv[1], sys.argv[2])
