"""Quota benchmark: the shared budget under R replica processes, against a naive peer.

    python -m bench.quota --backend mysql --replicas 4
    python -m bench.quota --backend sqlite --replicas 4

What it measures, each phase with R ``sandbox.quota_racer`` processes on a fresh database:

1. **grants/s, one hot key** (a grant is one slot: a block of 8 counts 8): every replica
   grants from one key whose limit is far above
   what the database can serve, so only the ledger itself is timed (``--block`` slots per
   grant: a replica leases a small block at a time).
2. **grants/s, 100 keys**: the same, each grant on a random one of 100 keys.
   ``hot_cold_ratio`` = (1) / (2); goal >= 0.5.
3. **limit use**: every replica sends real HTTP requests to a provider stand-in
   (``sandbox.quota_meter``) that allows ``--limit`` per ``--window`` seconds by its own
   clock, for ``--use-seconds`` (``--burst``: how many may start at once). ``limit_use`` =
   requests the provider accepted / what its limit allowed between the first and the last
   arrival (goal >= 0.95), ``violations`` = arrivals beyond the limit in any window of the
   provider's own, ``self_caused_429`` = 429s the provider answered;
   ``use_grant_p50_ms`` / ``use_grant_p99_ms``: one grant's latency in this phase (with
   ``--burst`` above 1 that is the slot log's path: lock, read, decide, conditional write).
``--fenced``: phases 1 to 3 take every slot as the daemon does, each under its own
claim's live fence with its reservation (``quota_reserve``, one slot per grant; each
racer claims a ``noop`` WorkItem first), instead of the ledger's bare arithmetic
(``quota_grant``): the fence's cost, compared with ``--block 1`` without it.

4. **the peer**: phase 3 again with process-local buckets (what a team would otherwise
   write: each replica believes it owns the whole limit), for ``--peer-seconds``.

Output: one JSON line with the figures; grant latency p50/p99 come from phases 1 and 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from bench import pairs
from bench.kernel import fresh_url, mysql_admin
from daemon.core.quota import QuotaPolicy
from daemon.core.work import WorkSpec
from sandbox.quota_meter import QuotaMeter
from storage.migrate import migrate
from storage.open import open_store

REPO = Path(__file__).resolve().parents[1]


async def _migrated(url: str) -> None:
    store = await open_store(url, sqlite_synchronous="NORMAL")
    try:
        await migrate(store.db, store.dialect, time.time_ns() // 1000)
    finally:
        await store.db.aclose()


async def _claimable(url: str, n: int) -> None:
    """``n`` noop WorkItems, one for each fenced racer to claim."""
    store = await open_store(url, sqlite_synchronous="NORMAL")
    try:
        await store.work_enqueue([WorkSpec(family="noop", org_id="bench",
                                           subject_kind="racer", subject_id=f"r{i}")
                                  for i in range(n)], time.time_ns() // 1000)
    finally:
        await store.db.aclose()


async def _racers(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    procs = [await trio.lowlevel.open_process(
        [sys.executable, "-m", "sandbox.quota_racer", json.dumps(s)], cwd=REPO,
        stdout=subprocess.PIPE) for s in specs]
    out = []
    for proc in procs:
        assert proc.stdout is not None
        data = b""
        async for chunk in proc.stdout:
            data += chunk
        if await proc.wait() != 0:
            raise SystemExit("a quota racer failed")
        out.append(json.loads(data))
    return out


def _percentile(values: list[int], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0


async def _throughput(url: str, replicas: int, keys: list[str], seconds: float,
                      block: int, fenced: bool = False) -> tuple[float, list[int]]:
    start_at = time.time() + 2.0
    specs = [{"url": url, "owner": f"r{i}", "start_at": start_at, "duration": seconds,
              "keys": keys, "limit": 1_000_000_000, "window": 1.0, "jitter": 0.0,
              "block": block, "max_wait": 60.0, "fenced": fenced} for i in range(replicas)]
    results = await _racers(specs)
    slots = sum(r["slots"] for r in results)
    latencies = [v for r in results for v in r["latency_us"]]
    return slots / seconds, latencies


async def _limit_use(url: str, replicas: int, *, limit: int, window: float, seconds: float,
                     jitter: float, block: int, local: bool, burst: int = 1,
                     fenced: bool = False) -> dict[str, Any]:
    meter = QuotaMeter(limit, window)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(meter.run)
        start_at = time.time() + 2.0
        specs = [{"url": url, "owner": f"r{i}", "start_at": start_at, "duration": seconds,
                  "keys": ["provider"], "limit": limit, "window": window, "jitter": jitter,
                  "block": block, "max_wait": 1.0, "local": local, "burst": burst,
                  "fenced": fenced and not local,
                  "meter": f"http://127.0.0.1:{port}"} for i in range(replicas)]
        results = await _racers(specs)
        async with httpx.AsyncClient() as client:
            report = (await client.get(f"http://127.0.0.1:{port}/_meter")).json()
        nursery.cancel_scope.cancel()
    # What the provider's limit allowed between the first and the last arrival.
    allowed = limit * max(1.0, report["span_s"] / window)
    accepted = report["arrivals"] - report["throttled"]
    latencies = [v for r in results for v in r["latency_us"]]
    return {"limit_use": round(accepted / allowed, 3), "violations": report["violations"],
            "self_caused_429": report["throttled"], "sent": report["arrivals"],
            "dropped_slots": sum(r["dropped"] for r in results),
            "use_grant_p50_ms": _percentile(latencies, 0.5),
            "use_grant_p99_ms": _percentile(latencies, 0.99)}


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url, name = fresh_url(args.backend, Path(tmp))
        try:
            await _migrated(url)
            if args.fenced:
                await _claimable(url, 3 * args.replicas)
            hot, hot_lat = await _throughput(url, args.replicas, ["hot"], args.seconds,
                                             args.block, args.fenced)
            cold, cold_lat = await _throughput(
                url, args.replicas, [f"cold{i}" for i in range(100)], args.seconds,
                args.block, args.fenced)
            use = await _limit_use(url, args.replicas, limit=args.limit, window=args.window,
                                   seconds=args.use_seconds, jitter=args.jitter, block=2,
                                   local=False, burst=args.burst, fenced=args.fenced)
            peer = await _limit_use(url, args.replicas, limit=args.limit, window=args.window,
                                    seconds=args.peer_seconds, jitter=args.jitter, block=2,
                                    local=True, burst=args.burst)
        finally:
            if name is not None:
                mysql_admin(f"DROP DATABASE IF EXISTS {name}")
    latencies = hot_lat + cold_lat
    use_policy = QuotaPolicy(limit=args.limit, window_us=int(args.window * 1e6),
                             jitter_us=int(args.jitter * 1e6), burst=args.burst)
    print(json.dumps({
        "bench": "quota", "backend": args.backend, "replicas": args.replicas,
        "block": 1 if args.fenced else args.block, "fenced": args.fenced,
        "hot_grants_per_s": round(hot, 1), "cold_grants_per_s": round(cold, 1),
        "hot_cold_ratio": round(hot / cold, 3) if cold else 0.0,
        "grant_p50_ms": _percentile(latencies, 0.5), "grant_p99_ms": _percentile(latencies, 0.99),
        "limit": f"{args.limit} per {args.window:g} s", "burst": args.burst,
        "use_seconds": args.use_seconds,
        **use,
        "schedule": ("slot log" if use_policy.uses_slot_log else "gcra"),
        "peer": "process-local buckets", "peer_violations": peer["violations"],
        "peer_self_caused_429": peer["self_caused_429"], "peer_limit_use": peer["limit_use"],
    }))


if __name__ == "__main__":
    pairs.delegate("bench.quota")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, metavar="N",
                        help="run as N interleaved pairs against --against (bench.pairs)")
    parser.add_argument("--against", metavar="REF", default="HEAD",
                        help="with --pairs: another checkout's directory or a commit")
    parser.add_argument("--backend", choices=["mysql", "sqlite"], default="mysql")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0, help="each throughput phase")
    parser.add_argument("--block", type=int, default=8, help="slots leased per grant")
    parser.add_argument("--limit", type=int, default=100, help="provider requests per window")
    parser.add_argument("--window", type=float, default=10.0, help="provider window (s)")
    parser.add_argument("--jitter", type=float, default=0.25, help="slot jitter (s)")
    parser.add_argument("--burst", type=int, default=1,
                        help="slots that may start at once (a sliding window's burst)")
    parser.add_argument("--use-seconds", type=float, default=60.0)
    parser.add_argument("--peer-seconds", type=float, default=20.0)
    parser.add_argument("--fenced", action="store_true",
                        help="every slot under a claim's live fence (the daemon's path)")
    trio.run(main, parser.parse_args())
