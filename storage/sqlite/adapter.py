"""The embedded SQLite adapter.

Theory of operation
-------------------
One connection per process, used by one transaction at a time (a
``trio.Lock``). Statements run inline on the trio thread: an indexed SQLite
statement costs microseconds, far less than a hop to a worker thread. The two
things that can take long are kept off the event loop:

* *waiting for the write lock*: ``busy_timeout`` is 0, so ``BEGIN IMMEDIATE``
  fails at once with ``SQLITE_BUSY`` and we sleep asynchronously with
  jittered backoff, then retry the whole transaction (a deferred read-then-
  write transaction would fail with ``BUSY_SNAPSHOT`` whatever the timeout,
  which is why every writing transaction begins ``IMMEDIATE``);
* *fsync at COMMIT* (``synchronous=FULL``, the default: a durable receipt must
  survive power loss), which runs in a worker thread.

The wait for the write lock is bounded by ``retry_budget_s``
(``storage.statement_timeout``); past it the transaction fails with
:class:`RetriesExhausted`, so a process holding the lock never hangs others.

WAL mode lets several processes on one host share the file; readers never
block the writer. Local disks only: WAL needs shared memory that network file
systems do not provide.
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import trio

from storage.dialect import SQLITE, Dialect
from storage.port import (
    DatabaseRejected,
    DatabaseUnavailable,
    DbStats,
    DuplicateKey,
    RetriesExhausted,
    Row,
    SqlTx,
    StatementTooLarge,
    StorageError,
)

T = TypeVar("T")

_TOOBIG = 18  # SQLITE_TOOBIG
_BUSY_CODES = {
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    getattr(sqlite3, "SQLITE_BUSY_SNAPSHOT", 517),
    getattr(sqlite3, "SQLITE_BUSY_RECOVERY", 261),
    getattr(sqlite3, "SQLITE_BUSY_TIMEOUT", 773),
}
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class _Busy(Exception):
    pass


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code in _BUSY_CODES:
        return True
    text = str(exc)
    return "database is locked" in text or "database table is locked" in text


def _too_big(conn: sqlite3.Connection, exc: sqlite3.DataError) -> StorageError:
    """SQLITE_TOOBIG: a value larger than the connection's length limit (nothing written)."""
    if getattr(exc, "sqlite_errorcode", None) != _TOOBIG:
        return StorageError(f"sqlite error: {exc}")
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
    return StatementTooLarge(
        f"sqlite: a value is larger than the database takes ({limit} bytes:"
        " SQLITE_LIMIT_LENGTH)", size=0, limit=limit)


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection, stats: DbStats) -> None:
        self._conn = conn
        self._stats = stats

    def _run(self, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        self._stats.statements += 1
        try:
            return self._conn.execute(sql, params)
        except sqlite3.DataError as exc:
            raise _too_big(self._conn, exc) from None
        except sqlite3.IntegrityError as exc:
            if "UNIQUE" in str(exc) or "PRIMARY KEY" in str(exc):
                raise DuplicateKey(str(exc)) from None
            raise StorageError(f"sqlite integrity error: {exc}") from None
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise _Busy() from exc
            raise StorageError(f"sqlite error: {exc}") from None

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._run(sql, params).rowcount

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        self._stats.statements += 1
        # A savepoint makes the batch all-or-nothing, like MySQL's multi-row
        # INSERT: callers fall back to row-at-a-time after a duplicate key.
        self._conn.execute("SAVEPOINT executemany")
        try:
            count = self._conn.executemany(sql, rows).rowcount
        except sqlite3.Error as exc:
            self._conn.execute("ROLLBACK TO SAVEPOINT executemany")
            self._conn.execute("RELEASE SAVEPOINT executemany")
            if isinstance(exc, sqlite3.IntegrityError):
                if "UNIQUE" in str(exc) or "PRIMARY KEY" in str(exc):
                    raise DuplicateKey(str(exc)) from None
                raise StorageError(f"sqlite integrity error: {exc}") from None
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise _Busy() from exc
            if isinstance(exc, sqlite3.DataError):
                raise _too_big(self._conn, exc) from None
            raise StorageError(f"sqlite error: {exc}") from None
        self._conn.execute("RELEASE SAVEPOINT executemany")
        return count

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._run(sql, params).fetchall()


class SqliteDatabase:
    """A :class:`storage.port.Database` over one SQLite file."""

    backend = "sqlite"
    dialect: Dialect = SQLITE

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        retry_budget_s: float = 30.0,
        max_statement_bytes: int | None = None,
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}")
        self.path = path
        self.synchronous = synchronous.upper()
        self.retry_budget_s = retry_budget_s
        self.stats = DbStats()
        self._lock = trio.Lock()
        self._conn: sqlite3.Connection | None = None
        # Lowers SQLITE_LIMIT_LENGTH (1e9 by default: no body ingress takes comes near it).
        self._cap = max_statement_bytes

    async def open(self, *, create: bool = True) -> SqliteDatabase:
        """Open (``create``: or create) the file. Without ``create``, a missing file is
        :class:`DatabaseRejected` naming the path: a read-only command must not leave an
        empty database behind where the operator mistyped the path."""
        if self.path != ":memory:":
            # Inline, as every statement of this adapter: a local file, no I/O wait.
            if not create and not Path(self.path).exists():  # noqa: ASYNC240
                raise DatabaseRejected(
                    f"no SQLite database at {self.path}: run `integrationd migrate` to create"
                    " it (storage.url sqlite:///a/b.db is relative to the directory"
                    " integrationd starts in; sqlite:////a/b.db is absolute)")
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=0
            )
            conn.execute("PRAGMA busy_timeout = 0")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if self.path != ":memory:" and mode[0].lower() != "wal":
                raise DatabaseUnavailable(f"sqlite could not enter WAL mode at {self.path}")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA foreign_keys = OFF")
            if self._cap is not None:
                conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self._cap)
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(f"cannot open sqlite database {self.path}: {exc}") from None
        self._conn = conn
        return self

    @property
    def max_statement_bytes(self) -> int:
        """SQLite binds each row of a batch alone: the bound is one value's length."""
        return self.conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise DatabaseUnavailable("sqlite database is not open")
        return self._conn

    async def ping(self) -> None:
        async with self._lock:
            try:
                self.conn.execute("SELECT 1").fetchone()
            except sqlite3.Error as exc:
                raise DatabaseUnavailable(f"sqlite: {exc}") from None

    async def transact(
        self, body: Callable[[SqlTx], Awaitable[T]], *, name: str, write: bool = True
    ) -> T:
        conn = self.conn
        deadline = trio.current_time() + self.retry_budget_s
        pause = 0.001
        started = trio.current_time()
        async with self._lock:
            self.stats.wait_seconds += trio.current_time() - started
            while True:
                try:
                    result = await self._attempt(conn, body, write)
                    self.stats.observe(name, trio.current_time() - started)
                    return result
                except _Busy:
                    self.stats.retries += 1
                    if trio.current_time() + pause > deadline:
                        raise RetriesExhausted(
                            f"{name}: sqlite stayed busy for {self.retry_budget_s:g}s"
                            " (storage.statement_timeout)"
                        ) from None
                    await trio.sleep(pause * (0.5 + random.random()))
                    pause = min(pause * 2, 0.05)

    async def _attempt(
        self, conn: sqlite3.Connection, body: Callable[[SqlTx], Awaitable[T]], write: bool
    ) -> T:
        try:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise _Busy() from exc
            raise StorageError(f"sqlite error: {exc}") from None
        try:
            result = await body(_SqliteTx(conn, self.stats))
            if write and self.synchronous in ("FULL", "EXTRA"):
                await trio.to_thread.run_sync(conn.execute, "COMMIT")
            else:
                conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
                self.stats.rollbacks += 1
            if isinstance(exc, sqlite3.OperationalError):
                if _is_busy(exc):
                    raise _Busy() from exc
                raise StorageError(f"sqlite error: {exc}") from None
            raise
        if write:
            self.stats.commits += 1
        return result

    async def aclose(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def sqlite_path_from_url(url: str, *, base: str | None = None) -> str:
    """``sqlite:///var/x.db`` is relative to ``base`` (or the cwd); ``sqlite:////abs`` absolute."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        raise ValueError("a SQLite URL starts with sqlite:///")
    rest = url[len(prefix) :]
    if not rest:
        raise ValueError("a SQLite URL needs a file path")
    if rest == ":memory:" or rest.startswith("/"):
        return rest
    return os.path.join(base or os.getcwd(), rest)
