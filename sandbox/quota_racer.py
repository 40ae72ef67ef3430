"""A separate OS process that draws on shared quota: ``python -m sandbox.quota_racer``.

Arguments (one JSON object): storage ``url``, ``owner``, ``start_at`` (Unix time every racer
starts at), ``duration`` (s), ``keys`` (quota keys to pick from at random), the policy
(``limit``, ``window``, ``jitter`` in s, ``burst``: how many may start at once),
``block`` (slots per grant), ``max_wait`` (s) and an
optional ``meter`` URL. Until the deadline it grants slots and, with a meter, sends one
request per slot at its slot time (a slot missed by more than the jitter is dropped, never
sent late). It prints one JSON line: grants, slots, sends, dropped slots, statuses and every
grant's latency in microseconds.

With ``"fenced": true`` every slot is a claim's (the daemon's path): the racer claims one
``noop`` WorkItem (the bench enqueues them) and takes each slot with
``QuotaLedger.quota_reserve``, the grant under that claim's live fence with its
reservation, one slot per grant (``block`` is ignored).

With ``"local": true`` it is the peer a team would otherwise write: the same schedule kept
in a process-local bucket per key (no database), so every replica believes it owns the
whole provider limit.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

import httpx
import trio

from daemon.core.lost_slots import SendGate
from daemon.core.quota import Granted, QuotaPolicy, QuotaState, Wait, grant
from daemon.core.work import Fence
from storage.open import open_store
from storage.port import ClaimParams
from storage.quota import SlotReserved
from storage.work_store import WorkStore


def _now_us() -> int:
    return time.time_ns() // 1000


class LocalBuckets:
    """The naive peer: one in-process budget per key, shared with nobody."""

    def __init__(self) -> None:
        self.states: dict[str, QuotaState] = {}

    async def quota_grant(self, key: str, policy: QuotaPolicy, *, now_us: int, count: int,
                          max_wait_us: int) -> Granted | Wait:
        got = grant(policy, self.states.get(key, QuotaState()), now_us=now_us, count=count,
                    max_wait_us=max_wait_us)
        if isinstance(got, Granted):
            self.states[key] = got.state
        return got


class FencedLedger:
    """The daemon's path: each slot granted under one claim's live fence, with its
    reservation (``quota_reserve``), one slot per grant."""

    def __init__(self, store: WorkStore, fence: Fence) -> None:
        self.store, self.fence = store, fence

    async def quota_grant(self, key: str, policy: QuotaPolicy, *, now_us: int, count: int,
                          max_wait_us: int) -> Granted | Wait:
        got = await self.store.quota_reserve(key, policy, fence=self.fence,
                                             gate=SendGate.CHECKPOINT, now=lambda: now_us,
                                             max_wait_us=max_wait_us)
        if isinstance(got, SlotReserved):
            return Granted((got.slot_us,), QuotaState(), (got.position_us,))
        return got


async def _claimed(store: WorkStore, owner: str) -> Fence:
    """One noop WorkItem of the racer's own, claimed for ten minutes."""
    while True:
        got = await store.work_claim(
            ClaimParams(family="noop", owner=owner, limit=1, lease_ttl_us=600_000_000,
                        window=64), _now_us())
        if got.claimed and got.claimed[0].fence is not None:
            return got.claimed[0].fence
        await trio.sleep(0.05)


async def race(spec: dict[str, Any]) -> dict[str, Any]:
    local = bool(spec.get("local"))
    store = None if local else await open_store(spec["url"], pool_size=1,
                                                sqlite_synchronous="NORMAL")
    ledger: Any = LocalBuckets() if store is None else store
    if store is not None and spec.get("fenced"):
        ledger = FencedLedger(store, await _claimed(store, spec["owner"]))
    policy = QuotaPolicy(limit=int(spec["limit"]), window_us=int(spec["window"] * 1e6),
                         jitter_us=int(spec.get("jitter", 0.25) * 1e6),
                         burst=int(spec.get("burst", 1)))
    keys: list[str] = list(spec["keys"])
    block = 1 if spec.get("fenced") else int(spec.get("block", 1))
    max_wait_us = int(spec.get("max_wait", 0) * 1e6)
    rng = random.Random(spec["owner"])
    out: dict[str, Any] = {"owner": spec["owner"], "grants": 0, "slots": 0, "sends": 0,
                           "dropped": 0, "waits": 0, "statuses": {}, "latency_us": []}
    client = httpx.AsyncClient(timeout=5.0) if spec.get("meter") else None
    await trio.sleep(max(0.0, spec["start_at"] - time.time()))
    # A racer that came up late (a loaded machine) still runs its whole duration.
    out["late_s"] = max(0.0, time.time() - spec["start_at"])
    deadline = time.time() + spec["duration"]
    try:
        while time.time() < deadline:
            key = rng.choice(keys)
            started = time.perf_counter_ns()
            got = await ledger.quota_grant(key, policy, now_us=_now_us(), count=block,
                                          max_wait_us=max_wait_us)
            out["latency_us"].append((time.perf_counter_ns() - started) // 1000)
            if not isinstance(got, Granted):
                out["waits"] += 1
                # Come back exactly when the budget allows, not on a backoff guess.
                await trio.sleep(max(0.0, min(got.until_us / 1e6, deadline) - time.time()))
                continue
            out["grants"] += 1
            out["slots"] += len(got.slots)
            if client is None:
                continue
            for slot in got.slots:
                await trio.sleep(max(0.0, slot / 1e6 - time.time()))
                if _now_us() >= slot + max(1, policy.jitter_us):
                    out["dropped"] += 1
                    continue
                response = await client.get(f"{spec['meter']}/q/{key}")
                out["sends"] += 1
                status = str(response.status_code)
                out["statuses"][status] = out["statuses"].get(status, 0) + 1
    finally:
        if client is not None:
            await client.aclose()
        if store is not None:
            await store.db.aclose()
    return out


async def _main(raw: str) -> None:
    result = await race(json.loads(raw))
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    trio.run(_main, sys.argv[1])
