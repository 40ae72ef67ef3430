"""A hung database never hangs the caller: every connect, statement and COMMIT is bounded.

A frozen server (SIGSTOP; here a proxy that accepts but never forwards) used to
hang a connect for ever (trio-mysql bounds only the TCP connect, not the
server's greeting), and a shutting-down process waited on shielded COMMITs.
SQLite's counterpart is another process holding the write lock.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from storage.mysql.adapter import MysqlDatabase, MysqlTarget
from storage.port import CommitOutcomeUnknown, DatabaseUnavailable, RetriesExhausted, SqlTx
from storage.sqlite.adapter import SqliteDatabase
from tests.support.backends import FreshDatabase, fresh_database
from tests.support.chaos_proxy import ChaosProxy

# Generous: the bounds under test are well under a second; this only proves "no hang".
NO_HANG_S = 10.0


@pytest.fixture
async def mysql_db(tmp_path: Path) -> AsyncIterator[FreshDatabase]:
    async with fresh_database("mysql", tmp_path) as tdb:
        yield tdb


async def _proxied(tdb: FreshDatabase, nursery: trio.Nursery, *, connect_timeout_s: float = 0.5,
                   statement_timeout_s: float = 0.5) -> tuple[MysqlDatabase, ChaosProxy]:
    target = MysqlTarget.from_url(tdb.url)
    proxy = ChaosProxy(target.host, target.port)
    port = await nursery.start(proxy.run)
    via = MysqlTarget.from_url(f"mysql://{target.user}@127.0.0.1:{port}/{target.database}")
    db = MysqlDatabase(via, pool_size=2, connect_timeout_s=connect_timeout_s,
                       statement_timeout_s=statement_timeout_s)
    return db, proxy


async def _select_one(tx: SqlTx) -> list[tuple[object, ...]]:
    return await tx.fetchall("SELECT 1")


@pytest.mark.mysql
async def test_connect_to_a_hung_database_fails_within_connect_timeout(
    mysql_db: FreshDatabase,
) -> None:
    async with trio.open_nursery() as nursery:
        db, proxy = await _proxied(mysql_db, nursery, connect_timeout_s=0.5)
        proxy.freeze()  # TCP accepted, but the server's greeting never comes
        with trio.fail_after(NO_HANG_S), pytest.raises(
            DatabaseUnavailable, match=r"no answer within 0\.5s \(storage\.connect_timeout\)"
        ):
            await db.ping()
        proxy.thaw()
        await db.ping()  # and it recovers
        await db.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.mysql
async def test_statement_on_a_hung_database_fails_within_statement_timeout(
    mysql_db: FreshDatabase,
) -> None:
    async with trio.open_nursery() as nursery:
        db, proxy = await _proxied(mysql_db, nursery, statement_timeout_s=0.5)
        for write in (False, True):
            await db.ping()  # a pooled, healthy connection
            proxy.freeze()
            with trio.fail_after(NO_HANG_S), pytest.raises(
                DatabaseUnavailable, match=r"probe: no answer to (a statement|BEGIN) within 0\.5s"
            ):
                await db.transact(_select_one, name="probe", write=write)
            proxy.thaw()
        # The timed-out connections were discarded, not reused out of step.
        assert await db.transact(_select_one, name="probe", write=False) == [(1,)]
        await db.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.mysql
async def test_commit_on_a_hung_database_is_an_unknown_outcome_within_the_bound(
    mysql_db: FreshDatabase,
) -> None:
    async with trio.open_nursery() as nursery:
        db, proxy = await _proxied(mysql_db, nursery, statement_timeout_s=0.5)
        runs = 0

        async def body(tx: SqlTx) -> None:
            nonlocal runs
            runs += 1
            await tx.fetchall("SELECT 1")
            proxy.freeze()  # the COMMIT that follows gets no answer

        with trio.fail_after(NO_HANG_S), pytest.raises(
            CommitOutcomeUnknown, match=r"no answer to COMMIT within 0\.5s"
        ):
            await db.transact(body, name="t")
        assert runs == 1 and db.stats.unknown_commits == 1  # never blindly retried
        proxy.thaw()
        await db.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.mysql
@pytest.mark.parametrize("when", ["before", "while_waiting"])
async def test_abandon_deadline_gives_up_a_shielded_commit_at_shutdown(
    mysql_db: FreshDatabase, when: str
) -> None:
    async with trio.open_nursery() as nursery:
        # A statement bound far beyond the test: only the abandon deadline can end it.
        db, proxy = await _proxied(mysql_db, nursery, statement_timeout_s=600.0)
        committing = trio.Event()

        async def body(tx: SqlTx) -> None:
            await tx.fetchall("SELECT 1")
            proxy.freeze()
            committing.set()

        async def abandon_soon() -> None:
            await committing.wait()
            await trio.sleep(0.2)  # the COMMIT is waiting for its answer by now
            db.abandon_at(trio.current_time() + 0.3)

        if when == "before":
            db.abandon_at(trio.current_time() + 0.5)
        else:
            nursery.start_soon(abandon_soon)
        with trio.fail_after(NO_HANG_S), pytest.raises(CommitOutcomeUnknown, match="abandoned"):
            await db.transact(body, name="t")
        with pytest.raises(DatabaseUnavailable, match="shutting down"):
            await db.ping()  # past the deadline nothing new is attempted
        proxy.thaw()
        await db.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_sqlite_write_lock_held_elsewhere_fails_within_statement_timeout(
    backend: str, tmp_path: Path
) -> None:
    async with fresh_database(backend, tmp_path) as tdb:
        assert tdb.sqlite_path is not None
        db = await SqliteDatabase(tdb.sqlite_path, synchronous="NORMAL",
                                  retry_budget_s=0.5).open()
        other = sqlite3.connect(tdb.sqlite_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock for ever
        try:
            with trio.fail_after(NO_HANG_S), pytest.raises(
                RetriesExhausted, match=r"busy for 0\.5s"
            ):
                await db.transact(_select_one, name="t")
        finally:
            other.execute("ROLLBACK")
            other.close()
            await db.aclose()
