"""Conformance under faults: retryable conflicts retry the whole transaction; a COMMIT
with an unknown outcome is reconciled by reading, never blindly retried."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from daemon.core.outcomes import Succeeded
from daemon.core.states import WorkState
from storage.mysql.adapter import MysqlTarget
from storage.port import CommitOutcomeUnknown, DatabaseUnavailable, SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, fresh_database
from tests.support.chaos_proxy import ChaosProxy
from tests.support.work import T0, claim, enqueue, finalization

pytestmark = pytest.mark.mysql


@pytest.fixture
async def mysql_db(tmp_path: Path) -> AsyncIterator[FreshDatabase]:
    async with fresh_database("mysql", tmp_path) as tdb:
        yield tdb


async def _mark(store: WorkStore, wid: str, text: str) -> int:
    return await store.db.transact(
        lambda tx: tx.execute("UPDATE work_items SET operator_summary = ? WHERE work_id = ?",
                              (text, wid)),
        name="t",
    )


async def test_deadlock_retries_the_whole_transaction(mysql_db: FreshDatabase) -> None:
    a_store, b_store = await mysql_db.open_store(), await mysql_db.open_store()
    r1, r2 = await enqueue(a_store, 2)
    a_locked, b_locked = trio.Event(), trio.Event()
    runs = {"A": 0, "B": 0}

    async def body_a(tx: SqlTx) -> None:
        runs["A"] += 1
        await tx.execute("UPDATE work_items SET operator_summary = 'A1' WHERE work_id = ?", (r1,))
        a_locked.set()
        await b_locked.wait()
        await tx.execute("UPDATE work_items SET failure_class = 'A2' WHERE work_id = ?", (r2,))

    async def body_b(tx: SqlTx) -> None:
        runs["B"] += 1
        await a_locked.wait()
        await tx.execute("UPDATE work_items SET operator_summary = 'B2' WHERE work_id = ?", (r2,))
        b_locked.set()
        await tx.execute("UPDATE work_items SET failure_class = 'B1' WHERE work_id = ?", (r1,))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: a_store.db.transact(body_a, name="a"))
            nursery.start_soon(lambda: b_store.db.transact(body_b, name="b"))
    # One of them was the deadlock victim and ran its whole body again; both committed.
    assert sorted(runs.values()) == [1, 2]
    assert a_store.db.stats.retries + b_store.db.stats.retries == 1
    one, two = await a_store.work_get(r1), await a_store.work_get(r2)
    assert one is not None and two is not None
    assert one.failure_class == "B1" and two.failure_class == "A2"


async def test_lock_wait_timeout_retries_the_whole_transaction(mysql_db: FreshDatabase) -> None:
    holder, waiter = await mysql_db.open_store(), await mysql_db.open_store()
    (wid,) = await enqueue(holder)
    holding = trio.Event()
    release = trio.Event()
    runs = 0

    async def hold(tx: SqlTx) -> None:
        await tx.execute("UPDATE work_items SET operator_summary = 'held' WHERE work_id = ?",
                         (wid,))
        holding.set()
        await release.wait()

    async def wait_for_row(tx: SqlTx) -> None:
        nonlocal runs
        runs += 1
        if runs == 2:
            release.set()
        await tx.execute("SET SESSION innodb_lock_wait_timeout = 1")
        await tx.execute("UPDATE work_items SET failure_class = 'waited' WHERE work_id = ?",
                         (wid,))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: holder.db.transact(hold, name="hold"))
            await holding.wait()
            await waiter.db.transact(wait_for_row, name="wait")
    assert runs >= 2 and waiter.db.stats.retries >= 1
    row = await waiter.work_get(wid)
    assert row is not None and row.failure_class == "waited"


async def _via_proxy(mysql_db: FreshDatabase, nursery: trio.Nursery) -> tuple[WorkStore,
                                                                               ChaosProxy]:
    target = MysqlTarget.from_url(mysql_db.url)
    proxy = ChaosProxy(target.host, target.port)
    port = await nursery.start(proxy.run)
    url = f"mysql://{target.user}@127.0.0.1:{port}/{target.database}"
    return await mysql_db.open_store(url=url), proxy


async def test_commit_with_unknown_outcome_is_reported(mysql_db: FreshDatabase) -> None:
    direct = await mysql_db.open_store()
    (wid,) = await enqueue(direct)
    async with trio.open_nursery() as nursery:
        store, proxy = await _via_proxy(mysql_db, nursery)
        proxy.cut_after_next_commit()
        runs = 0

        async def body(tx: SqlTx) -> None:
            nonlocal runs
            runs += 1
            await tx.execute("UPDATE work_items SET operator_summary = 'maybe-committed' WHERE"
                             " work_id = ?", (wid,))

        with pytest.raises(CommitOutcomeUnknown):
            await store.db.transact(body, name="t")
        assert runs == 1  # never blindly retried
        assert store.db.stats.unknown_commits == 1
        # Reconcile by reading: the server did commit it.
        row = await direct.work_get(wid)
        assert row is not None and row.operator_summary == "maybe-committed"
        # The pool dropped the cut connection; the store keeps working.
        assert await _mark(store, wid, "after") == 1
        nursery.cancel_scope.cancel()


async def test_claim_with_unknown_commit_is_reconciled(mysql_db: FreshDatabase) -> None:
    direct = await mysql_db.open_store()
    ids = await enqueue(direct, 3)
    async with trio.open_nursery() as nursery:
        store, proxy = await _via_proxy(mysql_db, nursery)
        proxy.cut_after_next_commit()
        result = await claim(store, "A", limit=3)
        assert proxy.cuts == 1
        assert sorted(i.work_id for i in result.claimed) == sorted(ids)
        for item in result.claimed:
            row = await direct.work_get(item.work_id)
            assert row is not None and row.lease_token == item.lease_token
            assert row.state is WorkState.PROCESSING
        # Finalize through a cut COMMIT too: the result is read back, not guessed.
        proxy.cut_after_next_commit()
        fins = [finalization(i, Succeeded()) for i in result.claimed]
        results = await store.work_finalize_if_owner(fins, "A", lambda: T0)
        assert proxy.cuts == 2
        assert all(r.applied and r.state is WorkState.SUCCEEDED for r in results)
        assert await direct.work_execution_totals("noop") == (3, 3)
        nursery.cancel_scope.cancel()


async def test_a_lost_claim_commit_does_not_strand_the_batch(mysql_db: FreshDatabase) -> None:
    """Finding (issue 13): when a claim's COMMIT reply was lost and the database was
    still going away, the read-back failed and the whole batch was dropped until its
    lease expired (one attempt lost per item). The read-back is now retried."""
    direct = await mysql_db.open_store()
    ids = await enqueue(direct, 3)
    async with trio.open_nursery() as nursery:
        store, proxy = await _via_proxy(mysql_db, nursery)
        proxy.cut_after_next_commit(refuse_for=1.0)
        result = await claim(store, "A", limit=3)
        assert proxy.cuts == 1 and proxy.refused >= 1  # the read-back was refused first
        assert sorted(i.work_id for i in result.claimed) == sorted(ids)
        for item in result.claimed:
            assert (item.attempt, item.ownership_epoch) == (1, 1)
            row = await direct.work_get(item.work_id)
            assert row is not None and row.lease_token == item.lease_token
        fins = [finalization(i, Succeeded()) for i in result.claimed]
        assert all(r.applied for r in await store.work_finalize_if_owner(fins, "A", lambda: T0))
        summary = await direct.work_execution_summary("noop")
        assert (summary.executions, summary.succeeded_items) == (3, 3)
        nursery.cancel_scope.cancel()


async def test_unreachable_database_is_a_clear_error(mysql_db: FreshDatabase) -> None:
    async with trio.open_nursery() as nursery:
        store, proxy = await _via_proxy(mysql_db, nursery)
        proxy.refuse()
        with pytest.raises(DatabaseUnavailable, match=r"connect|connection|lost"):
            await claim(store)
        proxy.restore()
        assert (await claim(store)).claimed == []
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_sqlite_busy_retries_the_whole_transaction(backend: str, tmp_path: Path) -> None:
    async with fresh_database(backend, tmp_path) as tdb:
        store = await tdb.open_store()
        (wid,) = await enqueue(store)
        assert tdb.sqlite_path is not None
        other = sqlite3.connect(tdb.sqlite_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        runs = 0

        async def body(tx: SqlTx) -> None:
            nonlocal runs
            runs += 1
            await tx.execute("UPDATE work_items SET operator_summary = 'x' WHERE work_id = ?",
                             (wid,))

        async def release_later() -> None:
            await trio.sleep(0.2)
            other.execute("COMMIT")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_later)
            await store.db.transact(body, name="t")
        other.close()
        assert runs == 1 and store.db.stats.retries > 0
        row = await store.work_get(wid)
        assert row is not None and row.operator_summary == "x"
