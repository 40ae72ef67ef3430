"""End to end: real ``integrationd run`` processes, SIGKILL and SIGTERM, a real outage."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from daemon.core.states import WorkState
from storage.mysql.adapter import MysqlTarget
from storage.port import Row, SqlTx, WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.chaos_proxy import ChaosProxy
from tests.support.harness import wait_for
from tests.support.processes import start_replica, stop_all, write_config
from tests.support.work import enqueue

pytestmark = pytest.mark.slow


def wall_us() -> int:
    return time.time_ns() // 1000


async def wait_until(store: WorkStore, predicate: Callable[[], Awaitable[bool]],
                     within_s: float = 90.0) -> None:
    await wait_for(predicate, within_s=within_s)


async def test_sigkill_after_claim_is_reclaimed_after_lease_expiry(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url, lease_ttl=3.0, lease_margin=1.0)
    (slow,) = await enqueue(store, now=wall_us(), payload='{"sleep_ms": 4000}')
    quick = await enqueue(store, 30, now=wall_us())
    a = await start_replica(cfg, "a")
    started = [a]
    try:
        async def claimed_by_a() -> bool:
            item = await store.work_get(slow)
            return item is not None and item.state is WorkState.PROCESSING

        await wait_until(store, claimed_by_a)
        a.kill()  # SIGKILL mid-handler: no drain, no release
        await a.wait()
        held = await store.work_get(slow)
        assert held is not None and held.state is WorkState.PROCESSING
        assert held.ownership_epoch == 1
        b = await start_replica(cfg, "b")
        started.append(b)

        async def all_done() -> bool:
            return await store.work_count_open() == 0

        await wait_until(store, all_done)
        done = await store.work_get(slow)
        assert done is not None and done.state is WorkState.SUCCEEDED
        assert done.ownership_epoch == 2 and done.lease_owner != held.lease_owner
        # The killed execution is journaled too: lease_lost, superseded by B.
        assert [(e.ownership_epoch, e.outcome, e.replica, e.reclaimed_by)
                for e in await store.work_executions(slow)] == [
            (1, "lease_lost", held.lease_owner, done.lease_owner),
            (2, "succeeded", done.lease_owner, None)]
        rows, distinct = await store.work_execution_totals("noop")
        assert rows == distinct == len(quick) + 1  # nothing lost, nothing succeeded twice
        # A may have held some quick items too (claimed, finalization not yet sent):
        # whatever it lost is journaled, so every item shows every epoch it was granted.
        summary = await store.work_execution_summary("noop")
        lost = summary.by_outcome.get("lease_lost", 0)
        assert lost >= 1 and summary.executions == len(quick) + 1 + lost
        for wid in [slow, *quick]:
            item = await store.work_get(wid)
            assert item is not None
            assert [e.ownership_epoch for e in await store.work_executions(wid)] == list(
                range(1, item.ownership_epoch + 1))
        assert any(e["event"] == "work_lease_reclaimed" and e["work_id"] == slow
                   for e in b.events())
    finally:
        await stop_all(started)


async def test_sigkill_before_claim_loses_nothing(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    ids = await enqueue(store, 20, now=wall_us(), run_after_us=wall_us() + 4_000_000)
    a = await start_replica(cfg, "a")
    a.kill()  # before anything was ready to claim
    await a.wait()
    assert {i.state for i in await store.work_list(WorkQuery())} == {WorkState.PENDING}
    b = await start_replica(cfg, "b")
    try:
        async def all_done() -> bool:
            return await store.work_count_open() == 0

        await wait_until(store, all_done)
        for wid in ids:
            assert [e.ownership_epoch for e in await store.work_executions(wid)] == [1]
    finally:
        await stop_all([b])


async def test_sigterm_drains_in_flight_work_and_exits_zero(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url, drain_timeout=30.0)
    ids = await enqueue(store, 5, now=wall_us(), payload='{"sleep_ms": 1500}')
    a = await start_replica(cfg, "a")

    async def all_running() -> bool:
        items = await store.work_list(WorkQuery(state=WorkState.PROCESSING))
        return len(items) == len(ids)

    await wait_until(store, all_running)
    a.terminate()
    assert await a.wait() == 0
    states = {i.state for i in await store.work_list(WorkQuery())}
    assert states == {WorkState.SUCCEEDED}
    events = [e["event"] for e in a.events()]
    assert events.index("replica_draining") < events.index("replica_stopped")


async def test_drain_deadline_releases_unfinished_work(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url, drain_timeout=1.0)
    (wid,) = await enqueue(store, now=wall_us(), payload='{"sleep_ms": 600000}')
    a = await start_replica(cfg, "a")

    async def running() -> bool:
        item = await store.work_get(wid)
        return item is not None and item.state is WorkState.PROCESSING

    await wait_until(store, running)
    a.terminate()
    assert await a.wait() == 0
    item = await store.work_get(wid)
    assert item is not None
    assert (item.state, item.attempt, item.failure_class) == (WorkState.RETRY, 0, "released")


async def test_admin_listener_serves_metrics_and_health(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    await enqueue(store, 25, now=wall_us())
    a = await start_replica(cfg, "a")
    try:
        async def done() -> bool:
            return await store.work_count_open() == 0

        await wait_until(store, done)
        await trio.sleep(1.5)  # one depth sample later
        status, body = await a.get("/metrics")
        text = body.decode()
        assert status == 200
        assert 'integrationd_work_claimed_total{family="noop"} 25.0' in text
        assert 'integrationd_work_finalized_total{family="noop",outcome="succeeded"} 25.0' in text
        assert "integrationd_db_commits_total" in text
        assert "integrationd_work_queue_depth" in text
        assert "org-1" not in text  # no org ids in labels
        status, body = await a.get("/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        status, body = await a.get("/readyz")
        assert status == 200 and json.loads(body)["ready"] is True
        status, body = await a.get("/no/such/route")
        assert status == 404 and json.loads(body)["error"] == "not_found"
    finally:
        a.terminate()
        assert await a.wait() == 0


@pytest.mark.mysql
async def test_database_lost_while_running_backs_off_and_resumes(tmp_path: Path) -> None:
    from tests.support.backends import fresh_database

    async with fresh_database("mysql", tmp_path) as tdb, trio.open_nursery() as nursery:
        store = await tdb.open_store()
        target = MysqlTarget.from_url(tdb.url)
        proxy = ChaosProxy(target.host, target.port)
        port = await nursery.start(proxy.run)
        cfg = write_config(tmp_path / "a.toml",
                           f"mysql://{target.user}@127.0.0.1:{port}/{target.database}",
                           lease_ttl=6.0, lease_margin=2.0)
        ids = await enqueue(store, 300, now=wall_us(), payload='{"sleep_ms": 30}')
        a = await start_replica(cfg, "a")
        try:
            async def some_done() -> bool:
                return await store.work_count_open() < 250

            await wait_until(store, some_done)
            proxy.refuse()
            # Hold the outage until a claim has failed: with every slot busy the
            # scheduler claims again only once the in-flight items' trust horizon
            # (lease minus margin) has passed, which a fixed sleep could race.
            await wait_for(lambda: any(e["event"] == "work_claim_failed" for e in a.events()),
                           within_s=60)
            status, body = await a.get("/readyz")
            assert status == 503 and json.loads(body)["database"] == "unreachable"
            assert a.proc.returncode is None  # no crash
            proxy.restore()

            async def all_done() -> bool:
                return await store.work_count_open() == 0

            await wait_until(store, all_done)
            rows, distinct = await store.work_execution_totals("noop")
            assert rows == distinct == len(ids)
            assert a.proc.returncode is None
            assert any(e["event"] == "work_claim_resumed" for e in a.events())
        finally:
            a.terminate()
            assert await a.wait() == 0
            nursery.cancel_scope.cancel()


@pytest.mark.mysql
@pytest.mark.parametrize("backend", ["mysql"])
async def test_four_replicas_drain_20000_items_exactly_once(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "r.toml", database.url, batch_size=64, concurrency=256)
    for _ in range(20):
        await enqueue(store, 1000, now=wall_us())
    replicas = [await start_replica(cfg, f"r{i}") for i in range(4)]
    try:
        async def drained() -> bool:
            return await store.work_count_open() == 0

        await wait_until(store, drained, within_s=300)
        rows, distinct = await store.work_execution_totals("noop")
        assert (rows, distinct) == (20_000, 20_000)  # zero lost, none succeeded twice
        summary = await store.work_execution_summary("noop")
        assert (summary.executions, summary.repeated) == (20_000, 0)  # none ran twice
        for r in replicas:
            r.terminate()
        assert [await r.wait() for r in replicas] == [0, 0, 0, 0]
    finally:
        await stop_all(replicas)


@pytest.mark.galera
@pytest.mark.parametrize("backend", ["galera"])
async def test_three_replicas_on_three_galera_nodes_drain_items_exactly_once(
    backend: str, galera_cluster: object, database: FreshDatabase, store: WorkStore,
    tmp_path: Path
) -> None:
    """Issue 12: each replica on its own node, so their claim CASes race across nodes and
    the losers fail certification at COMMIT; still every item runs once and only once."""
    items = 6000
    replicas = []
    try:
        for i, url in enumerate(database.node_urls):
            cfg = write_config(tmp_path / f"r{i}.toml", url, batch_size=32, concurrency=64)
            replicas.append(await start_replica(cfg, f"r{i}"))
        for _ in range(items // 500):  # every replica is polling while the work arrives
            await enqueue(store, 500, now=wall_us())

        async def drained() -> bool:
            return await store.work_count_open() == 0

        await wait_until(store, drained, within_s=300)
        rows, distinct = await store.work_execution_totals("noop")
        assert (rows, distinct) == (items, items)  # zero lost, none succeeded twice
        summary = await store.work_execution_summary("noop")
        assert (summary.executions, summary.repeated) == (items, 0)  # none ran twice

        async def per_replica(tx: SqlTx) -> list[Row]:
            return await tx.fetchall(
                "SELECT replica, COUNT(*) FROM work_executions GROUP BY replica")

        ran = await store.db.transact(per_replica, name="test.per_replica", write=False)
        assert len(ran) == len(database.node_urls) == 3, ran  # every node's replica worked
        for r in replicas:
            r.terminate()
        assert [await r.wait() for r in replicas] == [0, 0, 0]
    finally:
        await stop_all(replicas)
