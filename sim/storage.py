"""Storage under the simulation: SQLite inline, with faults at statement boundaries.

:class:`FaultyDatabase` wraps one replica's :class:`~storage.sqlite.adapter.SqliteDatabase`
(opened with ``synchronous = NORMAL``, so COMMIT runs inline too: no worker thread, so
trio's scheduler decides every interleaving) and implements the same
:class:`storage.port.Database` contract. Before each statement, and around COMMIT, the
seeded fault schedule may inject:

* ``error``: the connection is lost: the statement fails (:class:`DatabaseUnavailable`) and
  so does every later statement of its transaction, which never commits;
* ``lock_timeout``: a writing statement fails alone with :class:`RetryableConflict`, as the
  MySQL adapter reports a lock wait timeout (1205: only the statement is rolled back); a
  body may catch it and go on (a savepoint), or let it escape, and then, as the MySQL
  adapter does, the whole transaction runs again;
* ``busy``: the write lock is taken (the adapter's own retry loop backs off and retries);
* ``slow``: the statement takes a while (the transaction holds the lock meanwhile);
* ``lost_before_commit``: the connection drops before COMMIT: nothing is committed, the
  caller sees :class:`CommitOutcomeUnknown`;
* ``lost_after_commit``: COMMIT happened, the caller still sees
  :class:`CommitOutcomeUnknown` (the case the ambiguity rules exist for).

These are the errors the MySQL adapter raises for the same events, so the code above is
exercised exactly as on a networked database. A frozen replica's statements wait at the
gate; a killed replica's statements fail without touching the file.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
import trio

from storage.port import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    DbStats,
    RetryableConflict,
    Row,
    SqlTx,
)
from storage.sqlite.adapter import SqliteDatabase, _Busy

T = TypeVar("T")


@attrs.define
class StorageFaults:
    error: float = 0.0
    lock_timeout: float = 0.0
    busy: float = 0.0
    slow: float = 0.0
    lost_before_commit: float = 0.0
    lost_after_commit: float = 0.0
    max_slow_s: float = 0.5


class _FaultyTx:
    def __init__(self, inner: SqlTx, db: FaultyDatabase) -> None:
        self._inner = inner
        self._db = db
        # After "connection lost" nothing more of this transaction reaches the server.
        self.doomed = False

    async def _before(self, sql: str) -> None:
        if self.doomed:
            raise DatabaseUnavailable("sqlite: connection lost (simulated)")
        try:
            await self._db.before_statement(sql)
        except DatabaseUnavailable:
            self.doomed = True
            raise

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        await self._before(sql)
        return await self._inner.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        await self._before(sql)
        return await self._inner.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        await self._before(sql)
        return await self._inner.fetchall(sql, params)


class FaultyDatabase:
    """One replica's connection, with the seed's storage faults."""

    def __init__(self, inner: SqliteDatabase, *, node: str, rng: Any, faults: StorageFaults,
                 gate: Callable[[str], Awaitable[None]], count: Callable[[str], None],
                 trace: Callable[..., None]) -> None:
        self.inner = inner
        self.node = node
        self.rng = rng
        self.faults = faults
        self.gate = gate
        self.count = count
        self.trace = trace
        self.enabled = True
        self.killed = False
        self.on_transaction: Callable[[], None] = lambda: None
        # Freeze the process when it next begins a transaction whose name starts with
        # this ("" any): a SIGSTOP at that await point (set by the world's chaos).
        self.freeze_at: str | None = None
        self.on_freeze: Callable[[str], None] = lambda name: None
        # An operator acts (and commits) when this replica next begins a transaction whose
        # name starts with this: the interleaving "between the context read and the
        # checkpoint", placed rather than hoped for (set by the world's operator).
        self.interleave_at: str | None = None
        self.on_interleave: Callable[[str], Awaitable[None]] | None = None
        # Told, once a transaction has committed, the order in which it began (its first
        # statement ran after every transaction that had returned before it) and what it
        # returned: the oracles order operator actions against checkpoints by it.
        self.on_committed: Callable[[str, int, Any], None] = lambda name, seq, result: None
        self.sequence: Callable[[], int] = lambda: 0
        self.dialect = inner.dialect

    @property
    def backend(self) -> str:
        return self.inner.backend

    @property
    def max_statement_bytes(self) -> int:
        return self.inner.max_statement_bytes

    @property
    def stats(self) -> DbStats:
        return self.inner.stats

    def _draw(self, kind: str) -> bool:
        p: float = getattr(self.faults, kind)
        if self.enabled and p and self.rng.random() < p:
            self.count(f"db.{kind}")
            self.trace("fault", fault=f"db.{kind}", node=self.node)
            return True
        return False

    async def before_statement(self, sql: str = "") -> None:
        await self.gate(self.node)
        if self.killed:
            raise DatabaseUnavailable("sqlite: the process is gone (simulated crash)")
        if self._draw("slow"):
            await trio.sleep(self.rng.uniform(0.01, self.faults.max_slow_s))
            await self.gate(self.node)
        if self._draw("busy"):
            raise _Busy()
        if self._draw("error"):
            # The connection is lost: this statement and the rest of its transaction fail.
            raise DatabaseUnavailable("sqlite: connection lost (simulated)")
        if sql.lstrip()[:6].upper() in ("UPDATE", "INSERT", "DELETE") \
                and self._draw("lock_timeout"):
            # MySQL's lock wait timeout (1205): only this statement is rolled back; the
            # transaction goes on (innodb_rollback_on_timeout = OFF, the default).
            raise RetryableConflict("sqlite: lock wait timeout exceeded (simulated)")

    async def ping(self) -> None:
        await self.gate(self.node)
        if self.killed:
            raise DatabaseUnavailable("sqlite: the process is gone (simulated crash)")
        await self.inner.ping()

    async def transact(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str,
                       write: bool = True) -> T:
        self.on_transaction()
        if self.freeze_at is not None and name.startswith(self.freeze_at):
            self.freeze_at = None
            self.on_freeze(name)
        if self.interleave_at is not None and name.startswith(self.interleave_at) \
                and self.on_interleave is not None:
            self.interleave_at = None
            await self.on_interleave(name)
        await self.gate(self.node)
        if self.killed:
            raise DatabaseUnavailable("sqlite: the process is gone (simulated crash)")
        began = 0

        async def faulty(tx: SqlTx) -> T:
            nonlocal began
            began = self.sequence()
            wrapped = _FaultyTx(tx, self)
            result = await body(wrapped)
            await self.gate(self.node)  # a freeze between the last statement and COMMIT
            if wrapped.doomed:  # the body went on after the connection was lost
                raise DatabaseUnavailable("sqlite: connection lost (simulated)")
            if self.killed:
                raise DatabaseUnavailable("sqlite: the process is gone (simulated crash)")
            if write and self._draw("lost_before_commit"):
                self.inner.stats.unknown_commits += 1
                raise CommitOutcomeUnknown(f"{name}: connection lost before COMMIT"
                                           " (simulated)")
            return result

        for tries in range(1, 100):
            try:
                result = await self.inner.transact(faulty, name=name, write=write)
                break
            except RetryableConflict:
                # What the MySQL adapter does with a conflict that escapes the body: the
                # whole transaction again, after a pause.
                if tries >= 5:
                    raise
                await trio.sleep(self.rng.uniform(0.001, 0.05))
        self.on_committed(name, began, result)
        if write and self._draw("lost_after_commit"):
            self.inner.stats.unknown_commits += 1
            raise CommitOutcomeUnknown(f"{name}: connection lost after COMMIT (simulated)")
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()
