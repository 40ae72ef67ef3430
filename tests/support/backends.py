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

A migrated fresh database is a *clone*: the 41 migrations run once per session and
backend into a template, and each test's database is made from what they left (the
SQLite file copied; on MariaDB and Galera the template's ``SHOW CREATE TABLE``
statements and rows replayed in one round trip), because on MariaDB every migration's
DDL fsyncs and a real migration costs ~0.3 s per test (CI has over 900 such tests).
tests/storage/test_schema_clone.py proves a clone equal to a really migrated database
on every backend (tables, columns, indexes, options, rows), so the shortcut cannot
drift; a test about the migrations themselves asks for ``clone=False`` or
``migrated=False``.

A finished test's MariaDB database is dropped on a thread of its own (:class:`Dropper`):
a DROP DATABASE deletes and fsyncs a file per table, which the next test need not wait
for. The session waits for every drop before it ends (tests/conftest.py). Galera's drops
stay in the test: its tests kill and restart nodes.
"""

from __future__ import annotations

import atexit
import os
import queue
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio_mysql
from trio_mysql.constants import CLIENT

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


async def admin_execute(sql: str, url: str = MYSQL_URL, *, script: bool = False
                         ) -> list[tuple[object, ...]]:
    """Run ``sql`` on a connection of its own; with ``script``, several statements
    separated by ``;`` in one round trip (the first statement's rows are returned)."""
    target = MysqlTarget.from_url(url)
    conn = trio_mysql.connect(
        host=target.host, port=target.port, user=target.user, password=target.password,
        database=target.database, charset="utf8mb4", use_unicode=True, autocommit=True,
        client_flag=CLIENT.MULTI_STATEMENTS if script else 0,
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
        rows = list(await cur.fetchall())
        # A later statement's error is raised when its result is read.
        while await cur.nextset():
            pass
        return rows
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


async def _migrate_into(tdb: FreshDatabase) -> None:
    """Run every migration, as a replica's ``integrationd migrate`` does."""
    store = await tdb.open_store()
    await migrate(store.db, store.dialect, EPOCH_US)


# What a migrated database is, captured once per session: the SQLite template file, and
# per MySQL-family server (its admin URL) the statements that make the schema and rows.
_sqlite_template: list[Path] = []
_mysql_scripts: dict[str, str] = {}


async def sqlite_template() -> Path:
    """A migrated SQLite file, made on first use and kept for the session (closed, so the
    whole database is this one file: its copy is a migrated database)."""
    if not _sqlite_template:
        directory = Path(tempfile.mkdtemp(prefix="integrationd-schema-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        path = directory / "migrated.db"
        tdb = FreshDatabase("sqlite", f"sqlite:///{path}", sqlite_path=str(path))
        try:
            await _migrate_into(tdb)
        finally:
            await tdb.close_all()
        # Once per session, a directory of one or two entries: not worth a thread.
        leftovers = [p.name for p in directory.iterdir() if p != path]  # noqa: ASYNC240
        if leftovers:
            raise RuntimeError(f"the SQLite template kept {leftovers} after closing:"
                               " a copy of its main file alone would not be migrated")
        _sqlite_template.append(path)
    return _sqlite_template[0]


async def schema_script(url: str) -> str:
    """The statements that make a database's tables and rows again (run in another,
    empty database): its ``SHOW CREATE TABLE`` output and one INSERT per non-empty table.
    Tables and rows only: anything else a migration could make (a view, trigger, routine
    or event) is refused here rather than silently left out of every clone."""
    target = MysqlTarget.from_url(url)
    conn = trio_mysql.connect(
        host=target.host, port=target.port, user=target.user, password=target.password,
        database=target.database, charset="utf8mb4", use_unicode=True, autocommit=True,
    )
    await conn.connect()
    try:
        cur = conn.cursor()
        await cur.execute("SELECT table_name, table_type FROM information_schema.tables"
                          " WHERE table_schema = DATABASE() ORDER BY table_name")
        kinds = {str(name): str(kind) for name, kind in await cur.fetchall()}
        others = [f"{kind} {name}" for name, kind in kinds.items() if kind != "BASE TABLE"]
        for kind, sql in (
            ("TRIGGER", "SELECT trigger_name FROM information_schema.triggers"
                        " WHERE trigger_schema = DATABASE()"),
            ("ROUTINE", "SELECT routine_name FROM information_schema.routines"
                        " WHERE routine_schema = DATABASE()"),
            ("EVENT", "SELECT event_name FROM information_schema.events"
                      " WHERE event_schema = DATABASE()"),
        ):
            await cur.execute(sql)
            others += [f"{kind} {name}" for (name,) in await cur.fetchall()]
        if others:
            raise RuntimeError(f"the migrations made {others}: a clone copies tables and rows"
                               " only (tests/support/backends.py schema_script)")
        # No table names another today; should one, its creation order must not matter.
        statements = ["SET SESSION foreign_key_checks = 0"]
        for table in kinds:
            await cur.execute(f"SHOW CREATE TABLE `{table}`")
            ((_, ddl),) = await cur.fetchall()
            statements.append(str(ddl))
        for table in kinds:
            await cur.execute(f"SELECT * FROM `{table}`")
            rows = await cur.fetchall()
            if rows:
                columns = ", ".join(f"`{d[0]}`" for d in cur.description)
                values = ",\n".join(
                    "(" + ", ".join(conn.escape(v) for v in row) + ")" for row in rows)
                statements.append(f"INSERT INTO `{table}` ({columns}) VALUES\n{values}")
        return ";\n".join(statements)
    finally:
        await conn.aclose()


async def _mysql_template_script(admin_url: str, url_of: Callable[[str], str]) -> str:
    """:func:`schema_script` of a database really migrated on this server, once per
    session (the template database is dropped once read)."""
    if admin_url not in _mysql_scripts:
        name = f"itmpl_{secrets.token_hex(6)}"
        try:
            await admin_execute(
                f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", admin_url)
            tdb = FreshDatabase("mysql", url_of(name))
            try:
                await _migrate_into(tdb)
            finally:
                await tdb.close_all()
            _mysql_scripts[admin_url] = await schema_script(url_of(name))
        finally:
            await admin_execute(f"DROP DATABASE IF EXISTS {name}", admin_url)
    return _mysql_scripts[admin_url]


class Dropper:
    """Drops databases on a thread of its own, one at a time, in the order given; at most
    ``backlog`` wait (then :meth:`drop` waits too), so a session never runs ahead of its
    drops by more than that."""

    def __init__(self, backlog: int = 8) -> None:
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue(maxsize=backlog)
        self._thread: threading.Thread | None = None
        self.failures: list[str] = []
        self.drop_s: list[float] = []  # how long each DROP took (bench.test_databases)

    async def drop(self, name: str, admin_url: str) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drop-databases",
                                            daemon=True)
            self._thread.start()
            atexit.register(self.wait)
        try:
            self._queue.put_nowait((name, admin_url))
        except queue.Full:
            await trio.to_thread.run_sync(self._queue.put, (name, admin_url))

    def _run(self) -> None:
        while True:
            name, admin_url = self._queue.get()
            started = time.perf_counter()
            try:
                trio.run(admin_execute, f"DROP DATABASE IF EXISTS {name}", admin_url)
            except Exception as exc:  # reported by wait(), never lost with the thread
                self.failures.append(f"DROP DATABASE {name}: {exc!r}")
            finally:
                self.drop_s.append(time.perf_counter() - started)
                self._queue.task_done()

    def wait(self) -> None:
        """Return once every database handed over is dropped; raise if any was not."""
        self._queue.join()
        if self.failures:
            failures, self.failures = self.failures, []
            raise RuntimeError(f"{len(failures)} test databases were not dropped: {failures}")


DROPPER = Dropper()


@asynccontextmanager
async def fresh_database(backend: str, tmp_path: Path, *, migrated: bool = True,
                         clone: bool = True) -> AsyncIterator[FreshDatabase]:
    """A new database of ``backend``, dropped afterwards: empty, or (``migrated``) with
    every migration's schema and rows. ``clone`` makes the migrated database from the
    session's template (see the module's docstring); ``clone=False`` runs the migrations
    themselves, for a test about them."""
    cloned = migrated and clone
    name: str | None = None
    made = False
    admin_url = MYSQL_URL
    create = "CREATE DATABASE {} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    try:
        if backend == "sqlite":
            path = str(tmp_path / "integrationd.db")
            tdb = FreshDatabase("sqlite", f"sqlite:///{path}", sqlite_path=path)
            if cloned:
                shutil.copyfile(await sqlite_template(), path)
        elif backend == "galera":
            cluster = running_galera()
            first = cluster.nodes[0]
            admin_url = first.url("mysql")
            script = await _mysql_template_script(admin_url, first.url) if cloned else ""
            name = f"gtest_{secrets.token_hex(6)}"
            if cloned:
                await admin_execute(f"{create.format(name)};\nUSE {name};\n{script}",
                                     admin_url, script=True)
            else:
                await admin_execute(create.format(name), admin_url)
            # The other nodes apply the DDL a moment later, and a connect naming the
            # database is no causal read: a SELECT there (wsrep_sync_wait) waits until
            # they have.
            for node in cluster.nodes[1:]:
                await admin_execute("SELECT 1", node.url("mysql"))
            tdb = FreshDatabase("galera", first.url(name),
                                node_urls=tuple(node.url(name) for node in cluster.nodes))
        else:
            base = MysqlTarget.from_url(MYSQL_URL)

            def url_of(database: str) -> str:
                return f"mysql://{base.user}@{base.host}:{base.port}/{database}"

            script = await _mysql_template_script(admin_url, url_of) if cloned else ""
            name = f"itest_{secrets.token_hex(6)}"
            if cloned:
                await admin_execute(f"{create.format(name)};\nUSE {name};\n{script}",
                                     admin_url, script=True)
            else:
                await admin_execute(create.format(name), admin_url)
            tdb = FreshDatabase("mysql", url_of(name))
        made = True
        try:
            if migrated and not clone:
                await _migrate_into(tdb)
            yield tdb
        finally:
            await tdb.close_all()
    finally:
        # A database whose making failed is dropped here, where a failure to drop it is
        # reported with the test's own.
        if name is not None and backend == "mysql" and made:
            await DROPPER.drop(name, admin_url)
        elif name is not None:
            await admin_execute(f"DROP DATABASE IF EXISTS {name}", admin_url)
