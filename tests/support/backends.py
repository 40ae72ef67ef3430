"""Real databases for tests: a fresh SQLite file, a fresh MariaDB database or a fresh
database on a 3-node Galera cluster, per test.

MariaDB is reached at ``$INTEGRATIOND_TEST_MYSQL_URL`` (default
``mysql://root@127.0.0.1:3306/test``); each test gets its own database on that
server, dropped afterwards. An unreachable server is a test *failure*, never a
skip: the MySQL-family suite must run wherever the suite runs.

Galera (issue 12) is the storage conformance suite's third backend: one cluster per
session (the ``galera_cluster`` fixture starts it and hands it to :func:`use_galera`),
a fresh database per test, and every store a test opens connected to the *next* node in
turn, so that a test with several stores races them across nodes (certification
conflicts at COMMIT, as a distributed engine reports them).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio_mysql

from sandbox.galera import GaleraCluster
from storage.migrate import migrate
from storage.mysql.adapter import MysqlDatabase, MysqlTarget
from storage.sqlite.adapter import SqliteDatabase
from storage.work_store import WorkStore

MYSQL_URL = os.environ.get("INTEGRATIOND_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
BACKENDS = ("sqlite", "mysql")
# The storage conformance suite (tests/storage) also runs on a Galera cluster.
STORAGE_BACKENDS = (*BACKENDS, "galera")
EPOCH_US = 1_800_000_000_000_000


_MARKS = {"mysql": [pytest.mark.mysql], "galera": [pytest.mark.galera]}


def backend_params(backends: Sequence[str] = BACKENDS) -> list[object]:
    """``backend`` fixture parameters, marked ``mysql`` or ``galera`` where they need one."""
    return [pytest.param(b, marks=_MARKS.get(b, []), id=b) for b in backends]


_galera: list[GaleraCluster] = []


def use_galera(cluster: GaleraCluster | None) -> None:
    """The running cluster ``fresh_database("galera", ...)`` creates its databases on."""
    _galera.clear()
    if cluster is not None:
        _galera.append(cluster)


def running_galera() -> GaleraCluster:
    if not _galera:
        raise RuntimeError("no Galera cluster is running: request the galera_cluster fixture")
    return _galera[0]


async def _admin_execute(sql: str, url: str = MYSQL_URL) -> list[tuple[object, ...]]:
    target = MysqlTarget.from_url(url)
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
        return list(await cur.fetchall())
    finally:
        await conn.aclose()


@attrs.define
class FreshDatabase:
    """One fresh database of one backend, and a way to open more stores on it."""

    backend: str
    url: str
    sqlite_path: str | None = None
    opened: list[WorkStore] = attrs.field(factory=list)
    # Galera: one URL per node; each store opened without ``url`` takes the next node.
    node_urls: tuple[str, ...] = ()
    _next_node: int = 0

    def next_url(self) -> str:
        """Where the next store connects: the database's URL, or on Galera the next node."""
        if not self.node_urls:
            return self.url
        url = self.node_urls[self._next_node % len(self.node_urls)]
        self._next_node += 1
        return url

    async def open_store(self, *, pool_size: int = 4, sqlite_synchronous: str = "NORMAL",
                         url: str | None = None,
                         max_statement_bytes: int | None = None) -> WorkStore:
        """Another independent store (own connections) on the same database (on Galera,
        on the next node in turn)."""
        if self.backend == "sqlite":
            assert self.sqlite_path is not None
            sdb = await SqliteDatabase(self.sqlite_path, synchronous=sqlite_synchronous,
                                       max_statement_bytes=max_statement_bytes).open()
            store = WorkStore(sdb, sdb.dialect)
        else:
            mdb = await MysqlDatabase(
                MysqlTarget.from_url(url or self.next_url()), pool_size=pool_size,
                transaction_timeout_s=20 if self.node_urls else 10,
                max_statement_bytes=max_statement_bytes,
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
        admin_url = MYSQL_URL
    elif backend == "galera":
        cluster = running_galera()
        name = f"gtest_{secrets.token_hex(6)}"
        urls = tuple(node.url(name) for node in cluster.nodes)
        admin_url = cluster.nodes[0].url("mysql")
        await _admin_execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                             admin_url)
        # The other nodes apply the DDL a moment later, and a connect naming the database
        # is no causal read: a SELECT there (wsrep_sync_wait) waits until they have.
        for node in cluster.nodes[1:]:
            await _admin_execute("SELECT 1", node.url("mysql"))
        tdb = FreshDatabase("galera", urls[0], node_urls=urls)
    else:
        name = f"itest_{secrets.token_hex(6)}"
        admin_url = MYSQL_URL
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
            await _admin_execute(f"DROP DATABASE IF EXISTS {name}", admin_url)
