"""The queue-pressure history's costs on MariaDB (issue 23 item 1): the per-minute
sample at a given number of open items, the History read of it per range over dense
samples, and the rebuild of its hour and day peaks.

A fresh database: ``--items`` open items over ``--families`` families (a quarter ready,
a quarter held, a quarter in a retry's backoff, a quarter claimed), loaded with one
multi-row INSERT per 5,000; then ``--days`` days of per-minute samples of every family
(what a cluster that ran that long has written) and their hour/day peaks by
``history_pressure_rebuild`` (timed). Reads are ``WorkStore.history_pressure`` per preset
range (all families and one), ``--requests`` each, p50/p95 in ms. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import trio

from bench.admin_ui import fresh_database
from daemon.core.history_range import PRESETS_US, resolve
from storage.history import BUCKET_US
from storage.history_pressure import ALL, SERIES
from storage.migrate import migrate
from storage.open import open_store
from storage.port import SqlTx
from storage.work_store import WorkStore


def _now_us() -> int:
    return time.time_ns() // 1000


async def load_items(store: WorkStore, items: int, families: int, now: int) -> None:
    columns = ("work_id, family, org_id, app_installation_id, subject_kind, subject_id,"
               " definition_ref, catalog_revision, catalog_digest, payload,"
               " payload_schema_version, engine_capability_version, queue_class, state,"
               " run_after_us, attempt, max_attempts, ownership_epoch, cancel_requested,"
               " created_at_us, updated_at_us, row_version")
    for start in range(0, items, 5000):
        rows: list[Any] = []
        for i in range(start, min(items, start + 5000)):
            kind = i % 4
            state = ("pending", "pending", "retry", "processing")[kind]
            run_after = now + 3_600_000_000 if kind in (1, 2) else now - 1_000_000
            rows.append((f"{i:026d}", f"family-{i % families}", "org-1", "app-1", "lead",
                         f"lead-{i}", "def", 1, "digest", "{}", 1, 1, "default", state,
                         run_after, 1 if kind == 2 else 0, 5, 1, 0, now, now, 1))
        marks = ", ".join(["(" + ", ".join("?" * 22) + ")"] * len(rows))

        async def body(tx: SqlTx, rows: list[Any] = rows, marks: str = marks) -> None:
            await tx.execute(f"INSERT INTO work_items ({columns}) VALUES {marks}",
                             tuple(v for row in rows for v in row))

        await store.db.transact(body, name="bench.items", write=True)


async def dense_samples(store: WorkStore, days: int, families: int, now: int) -> int:
    first = now - now % BUCKET_US - days * 1440 * BUCKET_US
    names = [ALL, *(f"family-{f}" for f in range(families))]
    count = 0
    for day in range(days):
        rows = [(BUCKET_US, first + (day * 1440 + m) * BUCKET_US, name, series,
                 (m * 7 + len(name) * 13) % 5000, 0)
                for m in range(1440) for name in names for series in SERIES]

        async def body(tx: SqlTx, rows: list[Any] = rows) -> None:
            await tx.executemany(
                "INSERT INTO history_pressure (level_us, bucket_us, family, series, n, more)"
                " VALUES (?, ?, ?, ?, ?, ?)", rows)

        await store.db.transact(body, name="bench.samples", write=True)
        count += len(rows)
    return count


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered), 1), "p95_ms": round(p95, 1)}


async def run(items: int, families: int, days: int, requests: int) -> dict[str, Any]:
    async with fresh_database() as url:
        store = await open_store(url, pool_size=4)
        try:
            now = _now_us()
            await migrate(store.db, store.dialect, now)
            await load_items(store, items, families, now)
            sample: list[float] = []
            for i in range(requests):
                t0 = time.perf_counter()
                assert await store.history_pressure_sample(now + i * BUCKET_US) is not None
                sample.append((time.perf_counter() - t0) * 1000)

            async def wipe(tx: SqlTx) -> None:
                await tx.execute("DELETE FROM history_pressure")

            await store.db.transact(wipe, name="bench.wipe", write=True)
            rows = await dense_samples(store, days, families, now)
            t0 = time.perf_counter()
            peaks = await store.history_pressure_rebuild()
            rebuild_s = time.perf_counter() - t0
            reads: dict[str, dict[str, float]] = {}
            for preset in PRESETS_US:
                chosen = resolve(now, preset, None, None)
                for family in (None, "family-0"):
                    times = []
                    for _ in range(requests):
                        t0 = time.perf_counter()
                        await store.history_pressure(chosen.since_us, chosen.until_us,
                                                     chosen.step_us, family)
                        times.append((time.perf_counter() - t0) * 1000)
                    reads[f"{preset}{'' if family is None else ' family'}"] = _ms(times)
        finally:
            await store.db.aclose()
    return {"bench": "history_pressure", "items": items, "families": families,
            "days": days, "sample_rows": rows, "peak_rows": peaks,
            "sample": _ms(sample), "rebuild_s": round(rebuild_s, 2), "reads": reads,
            "load_1m": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=100_000, help="open work items")
    parser.add_argument("--families", type=int, default=8)
    parser.add_argument("--days", type=int, default=8, help="days of per-minute samples")
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(trio.run(run, args.items, args.families, args.days, args.requests)))


if __name__ == "__main__":
    main()
