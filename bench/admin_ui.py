"""Admin console benchmark: server time of the busiest pages over 100,000 work items.

    python -m bench.admin_ui [--items 100000] [--requests 20]

What it does:

1. creates a fresh MariaDB database ``bench_ui_<random>`` on
   ``$INTEGRATIOND_BENCH_MYSQL_URL`` (default ``mysql://root@127.0.0.1:3306/test``),
   migrates it (``storage.migrate.migrate``) and enqueues the items in batches
   (``store.work_enqueue``) across 4 families, 50 orgs and some lanes;
2. with direct SQL, marks about 30 % of them dead (three failure classes),
   40 % succeeded and 5 % retry, and journals an execution for each finished
   one over the last hour;
3. starts a real replica (hypercorn on loopback, depth sampler every second,
   no work families so nothing is claimed) and signs in as an admin;
4. times ``requests`` sequential GETs (after 3 warm-ups) per target: the
   overview page, the DLQ page, a filtered work list, ``/metrics``, plus a few
   other filters for the record. Server time is the app's own ``Server-Timing``
   header (request in -> response out, inside the process); wall time is the
   client's, over loopback;
5. prints one JSON line (median and p95 per target, the targets, pass/fail)
   and drops the database.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio
import trio_mysql
from argon2 import PasswordHasher

from admin_ui.app import console_factory
from config.settings import AdminSettings, Operator, ReplicaSettings, Settings, WorkSettings
from daemon.core.work import WorkSpec
from daemon.services.clock import WallClock
from daemon.services.families import build_registry
from daemon.services.replica import Replica
from storage.migrate import migrate
from storage.mysql.adapter import MysqlTarget
from storage.open import open_store
from storage.port import SqlTx
from storage.work_store import WorkStore

MYSQL_URL = os.environ.get("INTEGRATIOND_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
FAMILIES = ("noop", "hubspot.push", "outreach.sync", "subscription.reconcile")
ORGS = 50
# Fate of item i by i % 20: 0-5 dead (3 classes), 6-13 succeeded, 14 retry, else pending.
DEAD_CLASSES = ("provider_rejected", "bad_payload", "auth_revoked")
TARGETS_MS = {"overview": 300.0, "dlq": 300.0, "metrics": 100.0}
PASSWORD = secrets.token_urlsafe(12)


def _now_us() -> int:
    return time.time_ns() // 1000


async def _admin(sql: str) -> None:
    target = MysqlTarget.from_url(MYSQL_URL)
    conn = trio_mysql.connect(host=target.host, port=target.port, user=target.user,
                              password=target.password, database=target.database,
                              charset="utf8mb4", use_unicode=True, autocommit=True)
    await conn.connect()
    try:
        cur = conn.cursor()
        await cur.execute(sql)
    finally:
        await conn.aclose()


@asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    name = f"bench_ui_{secrets.token_hex(4)}"
    await _admin(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    base = MysqlTarget.from_url(MYSQL_URL)
    try:
        yield f"mysql://{base.user}@{base.host}:{base.port}/{name}"
    finally:
        await _admin(f"DROP DATABASE IF EXISTS {name}")


def _fate(i: int) -> str:
    slot = i % 20
    if slot < 6:
        return f"dead-{DEAD_CLASSES[slot % 3]}"
    if slot < 14:
        return "succeeded"
    return "retry" if slot == 14 else "pending"


async def load(store: WorkStore, items: int) -> dict[str, int]:
    """Enqueue ``items`` and give them their fates with direct SQL."""
    await migrate(store.db, store.dialect, _now_us())
    done = 0
    while done < items:
        n = min(2000, items - done)
        specs = [
            WorkSpec(
                family=FAMILIES[(done + k) % len(FAMILIES)],
                org_id=f"org-{(done + k) % ORGS}",
                subject_kind=_fate(done + k),
                subject_id=f"lead-{done + k}",
                source_lane=f"lane-{(done + k) % 997}" if (done + k) % 10 == 0 else None,
                payload='{"bench": true}',
            )
            for k in range(n)
        ]
        await store.work_enqueue(specs, _now_us())
        done += n
    now = _now_us()
    counts: dict[str, int] = {}

    async def fates(tx: SqlTx) -> None:
        for cls in DEAD_CLASSES:
            counts[f"dead/{cls}"] = await tx.execute(
                "UPDATE work_items SET state = 'dead', terminal_outcome = 'dead',"
                " failure_class = ?, operator_summary = ?, attempt = max_attempts,"
                " ownership_epoch = 1, updated_at_us = ? WHERE subject_kind = ?",
                (cls, f"{cls}: the provider refused (bench)", now, f"dead-{cls}"))
        counts["succeeded"] = await tx.execute(
            "UPDATE work_items SET state = 'succeeded', terminal_outcome = 'succeeded',"
            " attempt = 1, ownership_epoch = 1, updated_at_us = ?"
            " WHERE subject_kind = 'succeeded'", (now,))
        counts["retry"] = await tx.execute(
            "UPDATE work_items SET state = 'retry', attempt = 1, ownership_epoch = 1,"
            " failure_class = 'timeout', updated_at_us = ? WHERE subject_kind = 'retry'",
            (now,))
        # One journaled execution per finished item, spread over the last hour.
        await tx.execute(
            "INSERT INTO work_executions (work_id, ownership_epoch, family, attempt, replica,"
            " outcome, finished_at_us) SELECT work_id, 1, family, 1, 'bench', state,"
            " ? - (created_at_us % 3600000000) FROM work_items"
            " WHERE state IN ('dead', 'succeeded')", (now,))

    await store.db.transact(fates, name="bench.fates")
    return counts


async def _sign_in(client: httpx.AsyncClient) -> None:
    page = await client.get("/admin/sign-in")
    found = re.search(r'<meta name="csrf-token" content="([^"]*)">', page.text)
    assert found is not None
    response = await client.post("/admin/sign-in", data={
        "name": "bench", "password": PASSWORD, "csrf_token": found.group(1)})
    assert response.status_code == 302, response.text


def _server_ms(response: httpx.Response) -> float:
    found = re.search(r"dur=([0-9.]+)", response.headers.get("server-timing", ""))
    assert found is not None
    return float(found.group(1))


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"median": round(statistics.median(ordered), 2), "p95": round(p95, 2)}


async def measure(client: httpx.AsyncClient, path: str, requests: int) -> dict[str, Any]:
    server, wall = [], []
    for i in range(requests + 3):
        started = time.perf_counter()
        response = await client.get(path)
        elapsed = (time.perf_counter() - started) * 1000
        assert response.status_code == 200, (path, response.status_code, response.text[:200])
        if i >= 3:
            server.append(_server_ms(response))
            wall.append(elapsed)
    return {"path": path, "server_ms": _summary(server), "wall_ms": _summary(wall)}


async def run(items: int, requests: int) -> dict[str, Any]:
    async with fresh_database() as url:
        store = await open_store(url, pool_size=4)
        try:
            t0 = time.perf_counter()
            fates = await load(store, items)
            load_s = time.perf_counter() - t0
            hashed = PasswordHasher().hash(PASSWORD)
            settings = Settings(
                replica=ReplicaSettings(heartbeat_interval=1.0),
                admin=AdminSettings(listen="127.0.0.1:0"),
                work=WorkSettings(depth_sample_interval=1.0),
                operators=(Operator(name="bench", role="admin", password_hash=hashed),),
            )
            replica = Replica(settings, store, build_registry(settings, {}), WallClock(),
                              replica_id="bench-ui", admin_app=console_factory())
            async with trio.open_nursery() as nursery:
                address = await nursery.start(replica.run)
                base = address if address.startswith("http") else f"http://{address}"
                with trio.fail_after(120):  # two depth samples: the overview has data
                    while True:
                        if len(replica.history) >= 2:
                            break
                        await trio.sleep(0.2)
                async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                    await _sign_in(client)
                    paths = {
                        "overview": "/admin/",
                        "dlq": "/admin/dlq",
                        "work_filtered": "/admin/work?family=hubspot.push&state=dead",
                        "metrics": "/metrics",
                        "api_overview": "/admin/api/overview",
                        "dlq_by_class": "/admin/dlq?family=noop&failure_class=auth_revoked"
                                        "&unreplayed=1",
                        "work_by_org_state": "/admin/api/work?org=org-7&state=pending",
                        "work_by_org": "/admin/api/work?org=org-7",
                        "work_by_subject": "/admin/api/work?subject=lead-4242",
                        "work_by_lane": "/admin/api/work?lane=lane-5",
                        "work_detail": None,
                    }
                    first = (await client.get("/admin/api/work?state=dead&limit=1")).json()
                    paths["work_detail"] = f"/admin/work/{first['items'][0]['work_id']}"
                    results = {name: await measure(client, path, requests)
                               for name, path in paths.items() if path}
                replica.request_drain()
        finally:
            await store.db.aclose()
    ok = all(results[name]["server_ms"]["p95"] < limit for name, limit in TARGETS_MS.items())
    return {
        "bench": "admin_ui",
        "backend": "mysql",
        "items": items,
        "fates": fates,
        "load_s": round(load_s, 1),
        "requests_per_target": requests,
        "results": results,
        "targets_ms_p95": TARGETS_MS,
        "ok": ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=100_000, help="work items to load")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per target")
    args = parser.parse_args()
    result = trio.run(run, args.items, args.requests)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
