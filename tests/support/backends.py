"""Real databases for tests: a fresh SQLite file or a fresh MariaDB database per test.

MariaDB is reached at ``$INTEGRATIOND_TEST_MYSQL_URL`` (default
``mysql://root@127.0.0.1:3306/test``); each test gets its own database on that
server, dropped afterwards. An unreachable server is a test *failure*, never a
skip: the MySQL-family suite must run wherever the suite runs.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio_mysql

from storage.migrate import migrate
from storage.mysql.adapter import MysqlDatabase, MysqlTarget
from storage.sqlite.adapter import SqliteDatabase
from storage.work_store import WorkStore

MYSQL_URL = os.environ.get("INTEGRATIOND_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
BACKENDS = ("sqlite", "mysql")
EPOCH_US = 1_800_000_000_000_000


async def _admin_execute(sql: str) -> None:
    target = MysqlTarget.from_url(MYSQL_URL)
    conn = trio_mysql.connect(
        host=target.host, port=target.port, user=target.user, password=target.password,
        database=target.database, charset="utf8mb4", use_unicode=True, autocommit=True,
    )
    try:
        await conn.connect()
    except trio_mysql.MySQLError as exc:
        raise RuntimeError(
            f"MariaDB is not reachable at {target.describe()} ({exc.args[-1]}); start it with"
            " `start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd`"
        ) from None
    try:
        cur = conn.cursor()
        await cur.execute(sql)
    finally:
        await conn.aclose()


@attrs.define
class FreshDatabase:
    """One fresh database of one backend, and a way to open more stores on it."""

    backend: str
    url: str
    sqlite_path: str | None = None
    opened: list[WorkStore] = attrs.field(factory=list)

    async def open_store(self, *, pool_size: int = 4, sqlite_synchronous: str = "NORMAL",
                         url: str | None = None) -> WorkStore:
        """Another independent store (own connections) on the same database."""
        if self.backend == "sqlite":
            assert self.sqlite_path is not None
            sdb = await SqliteDatabase(self.sqlite_path, synchronous=sqlite_synchronous).open()
            store = WorkStore(sdb, sdb.dialect)
        else:
            mdb = await MysqlDatabase(
                MysqlTarget.from_url(url or self.url), pool_size=pool_size,
                transaction_timeout_s=10,
            ).open()
            store = WorkStore(mdb, mdb.dialect)
        self.opened.append(store)
        return store

    async def close_all(self) -> None:
        for store in self.opened:
            await store.db.aclose()
        self.opened.clear()


@asynccontextmanager
async def fresh_database(backend: str, tmp_path: Path, *, migrated: bool = True
                         ) -> AsyncIterator[FreshDatabase]:
    if backend == "sqlite":
        path = str(tmp_path / "integrationd.db")
        tdb = FreshDatabase("sqlite", f"sqlite:///{path}", sqlite_path=path)
        name = None
    else:
        name = f"itest_{secrets.token_hex(6)}"
        await _admin_execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        base = MysqlTarget.from_url(MYSQL_URL)
        tdb = FreshDatabase("mysql", f"mysql://{base.user}@{base.host}:{base.port}/{name}")
    try:
        if migrated:
            store = await tdb.open_store()
            await migrate(store.db, store.dialect, EPOCH_US)
        yield tdb
    finally:
        await tdb.close_all()
        if name is not None:
            await _admin_execute(f"DROP DATABASE IF EXISTS {name}")
