"""The legacy claim loop, as a real process:
``python -m sandbox.legacy.worker URL FAMILY PROCESS_ID [HOLD_S]``.

Every pass it heartbeats (``claimant_processes``: owner ``legacy``, the owner
generation it saw, ``running``), claims one event if its claim statement admits
one, "executes" it for ``HOLD_S`` seconds (default 0) and finishes it
``succeeded`` (with the legacy outcome receipt when the WorkItem is fenced).
SIGTERM or SIGINT: it stops claiming, finishes what it holds, and reports
``stopped``. It prints one JSON line per finished event.
"""

from __future__ import annotations

import json
import signal
import sys
import time

import trio

from sandbox.legacy.store import claim_one, finish
from storage.open import open_store
from storage.work_store import WorkStore

LEASE_US = 60_000_000


def _now_us() -> int:
    return time.time_ns() // 1000


async def _heartbeat(store: WorkStore, family: str, process_id: str, state: str) -> None:
    gen = await store.owner_generation_get(family)
    await store.claimant_heartbeat(process_id, "legacy", family,
                                   gen.generation if gen is not None else 0, state, _now_us())


async def work(url: str, family: str, process_id: str, hold_s: float) -> None:
    store = await open_store(url, pool_size=1, sqlite_synchronous="NORMAL")
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                stop = trio.Event()

                async def on_signal() -> None:
                    async for _ in signals:
                        stop.set()
                        return

                nursery.start_soon(on_signal)
                await _heartbeat(store, family, process_id, "running")
                sys.stdout.write(json.dumps({"ready": process_id}) + "\n")
                sys.stdout.flush()
                while not stop.is_set():
                    await _heartbeat(store, family, process_id, "running")
                    event = await claim_one(store, family, process_id, LEASE_US, _now_us())
                    if event is None:
                        with trio.move_on_after(0.05):
                            await stop.wait()
                        continue
                    await trio.sleep(hold_s)
                    done = await finish(store, event, process_id, "succeeded", _now_us())
                    sys.stdout.write(json.dumps({"finished": event.event_id, "ok": done}) + "\n")
                    sys.stdout.flush()
                nursery.cancel_scope.cancel()
        await _heartbeat(store, family, process_id, "stopped")
    finally:
        await store.db.aclose()


if __name__ == "__main__":
    trio.run(work, sys.argv[1], sys.argv[2], sys.argv[3],
             float(sys.argv[4]) if len(sys.argv) > 4 else 0.0)
