"""An integrationd claimer as a real process, for the cutover fault matrix:
``python -m tests.support.cutover_replica URL FAMILY REPLICA_ID [HOLD_S]``.

It heartbeats into ``replicas`` (serving FAMILY), claims with the kernel's claim
statement (so the owner-generation gate applies), holds each item ``HOLD_S``
seconds and finalizes it ``succeeded`` under its fence. SIGTERM: it stops
claiming, finishes what it holds and reports ``stopped``. SIGSTOP/SIGCONT and
SIGKILL are what the tests use on it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

import trio

from daemon.core.outcomes import Succeeded, decide
from storage.open import open_store
from storage.port import ClaimParams, ReplicaInfo
from storage.work_store import WorkStore
from tests.support.work import POLICY

LEASE_US = 5_000_000


def _now_us() -> int:
    return time.time_ns() // 1000


async def _beat(store: WorkStore, replica: str, family: str, state: str, started: int) -> None:
    await store.replica_heartbeat(ReplicaInfo(
        replica_id=replica, hostname=socket.gethostname(), pid=os.getpid(), version="test",
        state=state, families=json.dumps([family]), started_at_us=started,
        heartbeat_at_us=_now_us()))


async def run(url: str, family: str, replica: str, hold_s: float) -> None:
    store = await open_store(url, pool_size=1, sqlite_synchronous="NORMAL")
    started = _now_us()
    try:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                async def on_signal() -> None:
                    async for _ in signals:
                        stop.set()
                        return

                nursery.start_soon(on_signal)
                await _beat(store, replica, family, "running", started)
                sys.stdout.write(json.dumps({"ready": replica}) + "\n")
                sys.stdout.flush()
                while not stop.is_set():
                    await _beat(store, replica, family, "running", started)
                    result = await store.work_claim(ClaimParams(
                        family=family, owner=replica, limit=1, lease_ttl_us=LEASE_US,
                        window=2, include_expired=True), _now_us())
                    if not result.claimed:
                        with trio.move_on_after(0.05):
                            await stop.wait()
                        continue
                    await trio.sleep(hold_s)
                    for item in result.claimed:
                        assert item.fence is not None
                        fin = decide(Succeeded(), fence=item.fence, attempt=item.attempt,
                                     max_attempts=item.max_attempts, policy=POLICY,
                                     jitter_sample=0.5, now_us=_now_us(), family=family)
                        (done,) = await store.work_finalize_if_owner([fin], replica,
                                                                     _now_us())
                        sys.stdout.write(json.dumps({"finished": item.work_id,
                                                     "ok": done.applied}) + "\n")
                        sys.stdout.flush()
                nursery.cancel_scope.cancel()
        await _beat(store, replica, family, "stopped", started)
    finally:
        await store.db.aclose()


if __name__ == "__main__":
    trio.run(run, sys.argv[1], sys.argv[2], sys.argv[3],
             float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
