"""Cursor reconciliation throughput: one run over N Prospects sharing a few updatedAt values.

``python -m bench.reconcile [--records N] [--page-size P] [--backend sqlite|mysql]`` seeds
the Outreach simulator (a real loopback server) with N Prospects, N/2 of them bulk-updated
to one updatedAt, publishes the shipped Catalog (with the page size given), and times one
``cursor_reconcile`` claim: every page listed over HTTP, every page's ``inbound_apply``
items inserted with the cursor move in one fenced transaction. Then it times a second run,
which re-lists the records inside the overlap window (those created just now), every
insert a dedupe no-op.
Prints one JSON line per run: ``system``, ``backend``, ``records``, ``listed`` (records
the run listed and offered), ``pages``, ``seconds``, ``records_per_s`` (listed per
second), ``inbound_items`` (cumulative: a re-listed record adds none).
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.kernel import fresh_url, mysql_admin
from config.catalog import build_catalog, load_definitions, load_object_binding_documents
from config.settings import BindingSettings, Secret
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from daemon.core.outcomes import decide
from daemon.core.retry import BackoffPolicy
from daemon.providers.executor import BoundedHttp
from daemon.services.catalog_view import CatalogView, publish_current
from daemon.services.families import WorkContext
from daemon.services.reconcile import RECONCILE_FAMILY, CursorReconciler, RunPayload, run_spec
from sandbox.outreach_sim import OutreachSimulator
from storage.migrate import migrate
from storage.open import open_store
from storage.port import ClaimParams, SqlTx

TOKEN = "bench-token"


@attrs.define
class _Clock:
    now: int

    def now_us(self) -> int:
        return self.now


async def _count(store: Any) -> int:
    async def body(tx: SqlTx) -> int:
        rows = await tx.fetchall("SELECT COUNT(*) FROM work_items WHERE family = ?",
                                 (INBOUND_APPLY_FAMILY,))
        return int(rows[0][0])

    result: int = await store.db.transact(body, name="bench.count", write=False)
    return result


async def bench(url: str, backend: str, records: int, page_size: int) -> list[dict[str, Any]]:
    store = await open_store(url)
    await migrate(store.db, store.dialect, int(time.time() * 1e6))
    sim = OutreachSimulator(tokens={TOKEN}, rate_limit=10**9)
    out: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sim.run)
        for i in range(1, records + 1):
            sim.put_prospect({"firstName": f"P{i}", "emails": [f"p{i}@example.com"]},
                             prospect_id=i)
        sim.bulk_update(list(range(1, records // 2 + 1)), {"stage": "bulk"},
                        updated_at="2026-06-01T00:00:00.000Z", notify=False)
        binding = BindingSettings(binding_id="outreach-main", provider="outreach",
                                  org_id="org-1", app_installation_id="app-1",
                                  remote_account_id="org-77",
                                  base_url=f"http://127.0.0.1:{port}", auth="static_token",
                                  token=Secret(TOKEN))
        _, documents = load_definitions()
        objects = copy.deepcopy(load_object_binding_documents())
        for doc in objects:
            doc["reconcile"]["page_size"] = page_size
        catalog = build_catalog(1, documents, (binding,), objects)
        clock = _Clock(int(time.time() * 1e6) + 3_600_000_000)  # an hour on: past the lag
        await publish_current(store, catalog, actor="bench", role="admin", reason="bench",
                              now_us=clock.now)
        http = BoundedHttp.open(4)
        reconciler = CursorReconciler(
            inbound_max_attempts=5, catalog=catalog, catalogs=CatalogView(store, catalog),
            http=http, max_attempts=5)
        offered: list[int] = []
        reconciler.on_offered = lambda stream, count: offered.append(count)
        policy = BackoffPolicy(base_s=1.0, cap_s=60.0)
        for number in (0, 1):
            await store.work_enqueue([run_spec(
                catalog, binding, RunPayload(binding="outreach-main", resource="prospect"),
                number=number, max_attempts=5)], clock.now)
            result = await store.work_claim(ClaimParams(
                family=RECONCILE_FAMILY, owner="bench", limit=1, lease_ttl_us=600_000_000,
                window=4, include_expired=True), clock.now)
            (item,) = result.claimed
            assert item.fence is not None
            ctx = WorkContext(item=item, fence=item.fence, store=store, clock=clock,
                              replica_id="bench")
            before = len(sim.requests)
            offered.clear()
            started = time.perf_counter()
            outcome = await reconciler.handle(ctx)
            seconds = time.perf_counter() - started
            final = decide(outcome, fence=item.fence, attempt=item.attempt,
                           max_attempts=item.max_attempts, policy=policy, jitter_sample=0.5,
                           now_us=clock.now, family=item.family)
            await store.work_finalize_if_owner([final], "bench", lambda: clock.now)
            out.append({"system": "integrationd", "backend": backend,
                        "run": "first" if number == 0 else "relist", "records": records,
                        "listed": sum(offered), "pages": len(sim.requests) - before,
                        "seconds": round(seconds, 3),
                        "records_per_s": round(sum(offered) / seconds, 1),
                        "inbound_items": await _count(store)})
            clock.now += 301_000_000
        await http.aclose()
        nursery.cancel_scope.cancel()
    await store.db.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--backend", choices=("sqlite", "mysql"), default="sqlite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reconcile-") as tmp:
        url, dbname = fresh_url(args.backend, Path(tmp))
        try:
            for line in trio.run(bench, url, args.backend, args.records, args.page_size):
                print(json.dumps(line, sort_keys=True), flush=True)
        finally:
            if dbname is not None:
                mysql_admin(f"DROP DATABASE {dbname}")


if __name__ == "__main__":
    main()
