"""The MySQL / MariaDB / TiDB adapter over trio-mysql.

Theory of operation
-------------------
trio-mysql has no pool, and if it is cancelled while sending it can leave a
half-written packet on an open connection. So this adapter owns a small pool
and follows one rule: a connection goes back to the pool only after a clean
COMMIT, or after a *server-reported* error (the error packet was read whole,
so the protocol is in step) followed by a successful ROLLBACK. After any
other exception, and after any cancellation, the connection is closed.

Whole-transaction retry: a body may run more than once. Deadlock (1213),
lock-wait timeout (1205), "record changed" (1020), and TiDB's write
conflicts (9007, 8002, 8022, 8028) restart it, bounded, with jittered
backoff. Such errors can arrive at COMMIT too (TiDB's optimistic conflicts,
Galera certification failures); the server then rolled back, so a retry is
safe.

Unknown outcomes: if the connection is lost or times out *during* COMMIT we
cannot know whether it committed. That raises :class:`CommitOutcomeUnknown`;
callers reconcile by reading. COMMIT itself is shielded from cancellation so
that shutting down never manufactures an unknown outcome, up to the
*abandon deadline* a shutting-down process sets (:meth:`abandon_at`): past it
a COMMIT still waiting for the server is given up as unknown.

A Galera node not ready for clients (joining, non-primary) answers 1047: that is
:class:`DatabaseUnavailable`, as for a server that is down, never a bug.

Hung servers: a server that accepts TCP but never answers (frozen, SIGSTOP,
a black-holed network) must never hang the caller. The connect, including the
server's greeting and authentication, is bounded by ``connect_timeout_s``;
every statement, COMMIT and ROLLBACK by ``statement_timeout_s``; a whole
transaction body by ``transaction_timeout_s``. A timeout raises
:class:`DatabaseUnavailable` (:class:`CommitOutcomeUnknown` at COMMIT) and the
connection, no longer in step, is closed. Refusals that waiting cannot fix
(access denied, unknown database) raise :class:`DatabaseRejected`.

Statement size: the server refuses a statement larger than its ``max_allowed_packet``
(16 MiB by default) by closing the connection, which the client sees as "connection lost
(2006)" and would take for an unreachable server. The limit is read at every connect, each
statement is measured as it will be sent (its parameters escaped) before it is sent, and
one larger than the limit raises :class:`StatementTooLarge` without being sent (the
connection and the transaction stay usable). ``executemany`` cuts a multi-row INSERT into
statements that each fit, so a batch is bounded by bytes as well as by rows; a single row
that does not fit raises :class:`StatementTooLarge` before any of the batch is sent.

Sessions run at READ COMMITTED (fewer gap locks for the claim path's point
updates), strict SQL mode, utf8mb4, and ``CLIENT.FOUND_ROWS`` so that the
affected-row count means *matched* rows, as it does on SQLite.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
import re
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import attrs
import trio
import trio_mysql
from trio_mysql.constants import CLIENT, SERVER_STATUS

from storage.dialect import MYSQL, Dialect
from storage.mysql.wire import FastConnection
from storage.port import (
    CommitOutcomeUnknown,
    DatabaseRejected,
    DatabaseUnavailable,
    DbStats,
    DuplicateKey,
    RetriesExhausted,
    Row,
    SqlTx,
    StatementTooLarge,
    StorageError,
    StorageRefused,
)

T = TypeVar("T")

# Deadlock, lock wait timeout, record changed since read (MariaDB/MySQL);
# TiDB write conflict, schema changed, txn too old / retry limit.
# ``INSERT INTO t (...) VALUES (<one row>)``: executemany repeats the row
# tuple (literals included, which the driver's own rewrite refuses) so that
# a batch is one multi-row INSERT, statement-atomic on InnoDB.
_INSERT_VALUES = re.compile(r"\s*(INSERT\b.+?\bVALUES\s*)(\(.*\))\s*\Z", re.DOTALL)
MULTI_ROW_CHUNK = 500
# The server's default max_allowed_packet (MariaDB 10.6+, MySQL 8): the limit assumed until
# the first connect has read the server's own.
DEFAULT_MAX_PACKET = 16 * 1024 * 1024
# A statement's packet also carries the command byte; the rest is margin.
PACKET_HEADROOM = 1024
# "Got a packet bigger than 'max_allowed_packet' bytes": the server closes the connection.
PACKET_TOO_LARGE_CODE = 1153
# Incorrect string value, incorrect/truncated value, incorrect integer value: the server's
# text quotes the value.
QUOTES_VALUE_CODES = frozenset({1366, 1367, 1292, 1411})
# Transactions that never queue behind the pool's other users: a lease renewal waiting for
# a connection behind the very handlers whose claims it keeps alive arrives after the
# lease's local trust horizon on a slow database, every claim is dropped and reclaimed, and
# the replicas livelock (the torture run on a loaded Galera cluster). They have a
# connection of their own, beyond ``pool_size`` (the lease keeper sends one at a time).
RESERVED_FOR = frozenset({"work.renew"})
RETRYABLE_CODES = frozenset({1213, 1205, 1020, 9007, 8002, 8022, 8028})
DUPLICATE_KEY_CODE = 1062
# Galera: "WSREP has not yet prepared node for application use" (a node joining the
# cluster, cut off from its primary component, or set to refuse queries). The statement
# did not run (at COMMIT: the transaction was not replicated, so it rolled back): the
# database is unavailable for now, which waiting fixes.
NOT_READY_CODE = 1047
# Access denied for user (1045; 1698 when no password was given), to database
# (1044); unknown database (1049).
REJECTED_CODES = {1044: "access denied", 1045: "access denied", 1698: "access denied",
                  1049: "unknown database"}


@attrs.frozen
class MysqlTarget:
    host: str
    port: int
    user: str
    password: str = attrs.field(repr=False)
    database: str

    @classmethod
    def from_url(cls, url: str, password: str | None = None) -> MysqlTarget:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("mysql", "tidb", "mariadb"):
            raise ValueError("a MySQL URL starts with mysql://")
        database = parts.path.lstrip("/")
        if not database or "/" in database:
            raise ValueError("a MySQL URL names one database: mysql://user@host:port/db")
        if not parts.hostname:
            raise ValueError("a MySQL URL needs a host")
        return cls(
            host=parts.hostname,
            port=parts.port or 3306,
            user=urllib.parse.unquote(parts.username or "root"),
            password=password
            if password is not None
            else urllib.parse.unquote(parts.password or ""),
            database=database,
        )

    def describe(self) -> str:
        """Where we connect, without the password."""
        return f"mysql://{self.user}@{self.host}:{self.port}/{self.database}"


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """Our statements use ``?``; trio-mysql wants ``%s`` (and a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


# The driver's own escape table (trio_mysql.converters.escape_string): backslash-escape
# NUL, backslash, LF, CR, ^Z and both quotes. ``str.translate`` is fastest with a dict
# on ASCII text (5x the driver's list) and with the driver's 128-entry list on other text
# (a dict lookup per non-ASCII character costs 2x): each is used where it is fastest.
_SPECIAL = {"\0": "\\0", "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\032": "\\Z",
            '"': '\\"', "'": "\\'"}
_ESCAPES = str.maketrans(_SPECIAL)
_ESCAPES_LIST = [_SPECIAL.get(chr(c), chr(c)) for c in range(128)]


def literal_for(conn: Any) -> Callable[[Any], str]:
    """``conn.literal`` with the common parameter types done inline.

    The driver escapes every parameter through four calls (``literal`` -> ``escape`` ->
    ``escape_string`` -> ``translate``, a dict lookup per non-string): the profile of a
    replica under the effects benchmark counted tens of thousands of them. Strings,
    plain ints (not bools: the driver writes those as 0/1) and None are formatted here
    exactly as the driver would; anything else goes to the driver. A session in
    NO_BACKSLASH_ESCAPES mode quotes differently: it gets the driver's own."""
    slow: Callable[[Any], str] = conn.literal
    if conn.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
        return slow

    def literal(value: Any) -> str:
        kind = type(value)
        if kind is str:
            # Printable ASCII without quotes or backslash (ids, names, states, digests)
            # has nothing to escape.
            if (str.isascii(value) and str.isprintable(value) and "'" not in value
                    and '"' not in value and "\\" not in value):
                return f"'{value}'"
            table = _ESCAPES if str.isascii(value) else _ESCAPES_LIST
            return "'" + str.translate(value, table) + "'"
        if kind is int:
            return str(value)
        if value is None:
            return "NULL"
        return slow(value)

    return literal


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, trio_mysql.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return int(exc.args[0])
    return None


def _server_reported(exc: BaseException) -> bool:
    """True when the server sent a whole error packet (the connection is still in step).

    Client-side codes (2000-2999: lost connection, out of sync...) are not.
    """
    code = _code(exc)
    return code is not None and not 2000 <= code < 3000


@attrs.define(eq=False)
class _Pooled:
    """A pooled connection and the socket stream it was opened with.

    trio-mysql forgets its stream when a read fails (``_force_close`` sets it
    to ``None`` after calling a ``close()`` that trio streams lack), which
    would leak the socket; we keep our own reference and close that.
    """

    conn: Any
    stream: Any

    @property
    def open(self) -> bool:
        return bool(self.conn.open)

    def discard(self) -> None:
        """Close without talking to the server (it may be out of step)."""
        if self.stream is not None:
            self.stream.socket.close()
            self.stream = None
        self.conn._sock = None
        self.conn._closed = True


def _close_half_open(conn: Any, stream: trio.SocketStream | None) -> None:
    """Close the socket of a connect that failed midway (the driver tries ``close()``,
    which trio streams lack, and would leak it)."""
    if stream is not None:
        stream.socket.close()
    conn._sock = None
    conn._closed = True


class _Retry(Exception):
    pass


class _StatementTimeout(DatabaseUnavailable):
    """No answer to one statement in time: the connection is out of step."""


class _MysqlTx:
    """One transaction's statements, all under one cancel scope (``bound``).

    The scope's deadline is the transaction's (``transaction_timeout_s`` from its
    start), moved before each statement to that statement's own bound when that
    comes first: one scope per transaction instead of one per statement (a trio
    deadline is cheap to move, a scope is not cheap to enter and leave), and put
    back after it. When it fires, :meth:`timed_out` says which bound it was."""

    def __init__(self, conn: Any, stats: DbStats, timeout_s: float, name: str,
                 bound: trio.CancelScope, max_statement_bytes: int = DEFAULT_MAX_PACKET) -> None:
        self._conn = conn
        self._max_bytes = max_statement_bytes
        self._stats = stats
        self._timeout_s = timeout_s
        self._name = name
        self._bound = bound
        self._tx_deadline = bound.deadline
        # What waited for the server last (BEGIN or a statement).
        self._waiting = ""
        # Set by a timeout: the connection is out of step; nothing more may use it.
        self.broken = False

    def _arm(self, what: str) -> None:
        if self.broken:
            raise _StatementTimeout(f"{self._name}: the connection timed out earlier")
        self._bound.deadline = min(self._tx_deadline, trio.current_time() + self._timeout_s)
        self._waiting = what

    def timed_out(self) -> _StatementTimeout | None:
        """After ``bound`` fired: the statement that timed out, or None when it was
        the transaction's own bound."""
        self.broken = True
        # The scope fires at its deadline: before the transaction's, it was a statement's.
        if self._waiting and trio.current_time() < self._tx_deadline:
            return _StatementTimeout(
                f"{self._name}: no answer to {self._waiting} within {self._timeout_s:g}s")
        return None

    def _disarm(self) -> None:
        """Between statements only the transaction's bound applies."""
        self._bound.deadline = self._tx_deadline

    def _too_large(self, size: int, what: str) -> StatementTooLarge:
        return StatementTooLarge(
            f"{self._name}: {what} of {size} bytes is larger than the server takes in one"
            f" statement ({self._max_bytes} bytes: max_allowed_packet less"
            f" {PACKET_HEADROOM})", size=size, limit=self._max_bytes)

    def _sized(self, query: str) -> bytes:
        """The statement as it is sent, or :class:`StatementTooLarge` (nothing sent)."""
        data = query.encode("utf-8")
        if len(data) > self._max_bytes:
            raise self._too_large(len(data), "a statement")
        return data

    async def _run(self, cur: Any, sql: str, params: Sequence[Any]) -> None:
        # Formatted here (as the driver would) so that its size is known before it is sent.
        literal = literal_for(self._conn)
        query = self._sized(to_pyformat(sql) % tuple([literal(v) for v in params])
                            if params else sql)
        self._arm("a statement")
        try:
            await cur.execute(query)
        finally:
            self._disarm()

    async def begin(self) -> None:
        self._arm("BEGIN")
        try:
            await self._conn.begin()
        finally:
            self._disarm()

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._stats.statements += 1
        cur = self._conn.cursor()
        try:
            await self._run(cur, sql, params)
        except trio_mysql.IntegrityError as exc:
            if _code(exc) == DUPLICATE_KEY_CODE:
                # InnoDB rolled back this statement only; the transaction goes on.
                raise DuplicateKey(str(exc.args[-1])) from None
            raise
        return int(cur.rowcount)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        if not rows:
            return 0
        insert = _INSERT_VALUES.match(sql)
        if insert is None:  # not a plain INSERT ... VALUES (...): one statement per row
            return sum([await self.execute(sql, row) for row in rows])
        statements = self._multi_row(insert.group(1), insert.group(2), rows)
        if len(statements) == 1:
            return await self._send(statements[0])
        # Several statements: a savepoint keeps the batch all-or-nothing.
        await self.execute("SAVEPOINT executemany")
        try:
            count = 0
            for statement in statements:
                count += await self._send(statement)
        except DuplicateKey:  # other errors end the whole transaction anyway
            await self.execute("ROLLBACK TO SAVEPOINT executemany")
            raise
        await self.execute("RELEASE SAVEPOINT executemany")
        return count

    def _multi_row(self, prefix: str, values: str, rows: Sequence[Sequence[Any]]
                   ) -> list[bytes]:
        """Multi-row INSERTs for ``rows``, each within the statement limit and
        ``MULTI_ROW_CHUNK`` rows; :class:`StatementTooLarge` (before anything is sent)
        when one row alone does not fit."""
        head = prefix.encode("utf-8")  # no placeholders before VALUES
        pattern = to_pyformat(values)
        literal = literal_for(self._conn)
        statements: list[bytes] = []
        parts: list[bytes] = []
        size = len(head)
        for row in rows:
            text = (pattern % tuple([literal(v) for v in row])).encode("utf-8")
            if len(head) + len(text) > self._max_bytes:
                raise self._too_large(len(head) + len(text), "one row")
            if parts and (size + 2 + len(text) > self._max_bytes
                          or len(parts) == MULTI_ROW_CHUNK):
                statements.append(head + b", ".join(parts))
                parts, size = [], len(head)
            size += len(text) + (2 if parts else 0)
            parts.append(text)
        statements.append(head + b", ".join(parts))
        return statements

    async def _send(self, statement: bytes) -> int:
        """One statement already formatted and measured."""
        self._stats.statements += 1
        cur = self._conn.cursor()
        self._arm("a statement")
        try:
            await cur.execute(statement)
        except trio_mysql.IntegrityError as exc:
            if _code(exc) == DUPLICATE_KEY_CODE:
                raise DuplicateKey(str(exc.args[-1])) from None
            raise
        finally:
            self._disarm()
        return int(cur.rowcount)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        self._stats.statements += 1
        cur = self._conn.cursor()
        await self._run(cur, sql, params)  # the driver buffers the whole result here
        return list(await cur.fetchall())


class MysqlDatabase:
    """A :class:`storage.port.Database` over a MySQL-family server."""

    backend = "mysql"
    dialect: Dialect = MYSQL

    def __init__(
        self,
        target: MysqlTarget,
        *,
        pool_size: int = 8,
        max_retries: int = 12,
        connect_timeout_s: float = 5.0,
        statement_timeout_s: float = 15.0,
        transaction_timeout_s: float = 30.0,
        max_statement_bytes: int | None = None,
    ) -> None:
        self.target = target
        self.stats = DbStats()
        self.max_retries = max_retries
        self.connect_timeout_s = connect_timeout_s
        self.statement_timeout_s = statement_timeout_s
        self.transaction_timeout_s = max(transaction_timeout_s, statement_timeout_s)
        self._idle: list[_Pooled] = []
        self._slots = trio.Semaphore(pool_size)
        # One more connection, for lease renewals only (RESERVED_FOR).
        self._reserved = trio.Semaphore(1)
        self._abandon_at = math.inf
        self._shields: set[trio.CancelScope] = set()
        # The server's max_allowed_packet less PACKET_HEADROOM, read at every connect (an
        # operator may change it); ``max_statement_bytes`` (tests, a proxy with a smaller
        # limit) lowers it further.
        self._cap = max_statement_bytes
        self._max_statement_bytes = self._capped(DEFAULT_MAX_PACKET)

    def _capped(self, packet: int) -> int:
        limit = packet - PACKET_HEADROOM
        return limit if self._cap is None else min(limit, self._cap)

    @property
    def max_statement_bytes(self) -> int:
        return self._max_statement_bytes

    def abandon_at(self, deadline: float) -> None:
        """From ``deadline`` (trio time) on, stop waiting for a server that does not answer:
        shielded COMMITs and ROLLBACKs are given up (outcome unknown) and new connections
        are not attempted. A shutting-down process sets it so that it always exits."""
        self._abandon_at = min(self._abandon_at, deadline)
        for shield in self._shields:  # COMMITs and ROLLBACKs already waiting, too
            shield.deadline = min(shield.deadline, deadline)

    @contextlib.contextmanager
    def _shielded(self) -> Iterator[trio.CancelScope]:
        """Shielded from cancellation, but not past the abandon deadline."""
        with trio.CancelScope(shield=True, deadline=self._abandon_at) as shield:
            self._shields.add(shield)
            try:
                yield shield
            finally:
                self._shields.discard(shield)

    async def open(self) -> MysqlDatabase:
        """Prove the server is reachable (one connection, kept in the pool)."""
        await self.ping()
        return self

    async def _connect(self) -> _Pooled:
        conn = FastConnection(
            host=self.target.host,
            port=self.target.port,
            user=self.target.user,
            password=self.target.password,
            database=self.target.database,
            charset="utf8mb4",
            use_unicode=True,
            client_flag=CLIENT.FOUND_ROWS,
            # Reads run as single-statement autocommit transactions (at READ
            # COMMITTED a multi-statement read transaction buys no consistency);
            # writes open an explicit BEGIN ... COMMIT.
            autocommit=True,
            # Unused: the driver would bound only the TCP connect. We open the
            # stream ourselves and bound the whole connect (greeting, login) below.
            connect_timeout=self.connect_timeout_s,
            sql_mode="STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION",
            init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        )
        where = self.target.describe()
        stream: trio.SocketStream | None = None
        try:
            with trio.fail_after(self.connect_timeout_s):
                # Our own stream, so that a failed connect never leaks its socket.
                stream = await trio.open_tcp_stream(self.target.host, self.target.port)
                stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                stream.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                await conn.connect(sock=stream)
                cur = conn.cursor()
                await cur.execute("SELECT @@max_allowed_packet")
                (packet,) = await cur.fetchone()
                self._max_statement_bytes = self._capped(int(packet))
        except trio.TooSlowError:
            _close_half_open(conn, stream)
            raise DatabaseUnavailable(
                f"cannot connect to {where}: no answer within {self.connect_timeout_s:g}s"
                " (storage.connect_timeout)"
            ) from None
        except trio_mysql.MySQLError as exc:
            _close_half_open(conn, stream)
            code = _code(exc)
            if code in REJECTED_CODES:
                raise DatabaseRejected(
                    f"{where}: {REJECTED_CODES[code]} ({code}): {exc.args[-1]}"
                ) from None
            raise DatabaseUnavailable(
                f"cannot connect to {where}: {exc.args[-1] if exc.args else exc}"
            ) from None
        except OSError as exc:
            _close_half_open(conn, stream)
            raise DatabaseUnavailable(f"cannot connect to {where}: {exc}") from None
        except BaseException:
            _close_half_open(conn, stream)
            raise
        return _Pooled(conn, stream)

    def _slots_for(self, name: str) -> trio.Semaphore:
        return self._reserved if name in RESERVED_FOR else self._slots

    async def _acquire(self, slots: trio.Semaphore) -> _Pooled:
        if trio.current_time() >= self._abandon_at:
            raise DatabaseUnavailable("shutting down: the database is no longer waited for")
        waited = trio.current_time()
        await slots.acquire()
        self.stats.wait_seconds += trio.current_time() - waited
        if self._idle:
            return self._idle.pop()
        try:
            return await self._connect()
        except BaseException:
            slots.release()
            raise

    def _release(self, pooled: _Pooled, reusable: bool, slots: trio.Semaphore) -> None:
        if reusable and pooled.open:
            self._idle.append(pooled)
        else:
            pooled.discard()
        slots.release()

    async def ping(self) -> None:
        async def body(tx: SqlTx) -> None:
            await tx.fetchall("SELECT 1")

        await self.transact(body, name="ping", write=False)

    async def transact(
        self, body: Callable[[SqlTx], Awaitable[T]], *, name: str, write: bool = True
    ) -> T:
        """``write=False`` bodies must only read: they run without BEGIN/COMMIT."""
        pause = 0.005
        started = trio.current_time()
        for attempt in range(self.max_retries + 1):
            try:
                result = await self._attempt(body, name, write)
                self.stats.observe(name, trio.current_time() - started)
                return result
            except _Retry as retry:
                self.stats.retries += 1
                if attempt == self.max_retries:
                    raise RetriesExhausted(
                        f"{name}: still conflicting after {self.max_retries} retries"
                        f" ({retry.args[0]})"
                    ) from None
                await trio.sleep(pause * (0.5 + random.random()))
                pause = min(pause * 2, 0.2)
        raise AssertionError("unreachable")

    async def _attempt(self, body: Callable[[SqlTx], Awaitable[T]], name: str, write: bool) -> T:
        slots = self._slots_for(name)
        pooled = await self._acquire(slots)
        conn = pooled.conn
        reusable = False
        bound = trio.CancelScope(deadline=trio.current_time() + self.transaction_timeout_s)
        tx = _MysqlTx(conn, self.stats, self.statement_timeout_s, name, bound,
                      self._max_statement_bytes)
        try:
            try:
                with bound:
                    if write:
                        await tx.begin()
                    result = await body(tx)
                if bound.cancelled_caught:
                    statement = tx.timed_out()
                    if statement is not None:
                        raise statement
                    raise DatabaseUnavailable(
                        f"{name}: no answer from {self.target.describe()} within"
                        f" {self.transaction_timeout_s:g}s"
                    )
            except _StatementTimeout as exc:
                raise DatabaseUnavailable(f"{exc} from {self.target.describe()}") from None
            except trio_mysql.MySQLError as exc:
                if write:
                    reusable = _server_reported(exc) and await self._rollback(conn)
                else:
                    reusable = _server_reported(exc)
                raise self._translate(exc, name) from None
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise DatabaseUnavailable(f"{name}: connection lost: {exc!r}") from None
            except Exception:
                # The body's own error (DuplicateKey, LostLease, a bug): every
                # statement completed, so the protocol is in step (unless the body
                # swallowed a statement timeout).
                if not tx.broken:
                    reusable = await self._rollback(conn) if write else True
                raise
            if tx.broken:  # the body swallowed a statement timeout
                raise DatabaseUnavailable(f"{name}: a statement timed out")
            reusable = await self._commit(conn, name) if write else True
            return result
        finally:
            self._release(pooled, reusable, slots)

    async def _commit(self, conn: Any, name: str) -> bool:
        with self._shielded() as shield:
            try:
                with trio.fail_after(self.statement_timeout_s):
                    await conn.commit()
            except trio_mysql.MySQLError as exc:
                if _server_reported(exc):
                    # The server refused the COMMIT and rolled back.
                    self.stats.rollbacks += 1
                    raise self._translate(exc, name) from None
                self.stats.unknown_commits += 1
                raise CommitOutcomeUnknown(f"{name}: connection lost during COMMIT") from None
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                self.stats.unknown_commits += 1
                raise CommitOutcomeUnknown(f"{name}: connection lost during COMMIT") from None
            except trio.TooSlowError:
                self.stats.unknown_commits += 1
                raise CommitOutcomeUnknown(
                    f"{name}: no answer to COMMIT within {self.statement_timeout_s:g}s"
                ) from None
        if shield.cancelled_caught:
            self.stats.unknown_commits += 1
            raise CommitOutcomeUnknown(f"{name}: COMMIT abandoned at shutdown, no answer yet")
        self.stats.commits += 1
        return True

    async def _rollback(self, conn: Any) -> bool:
        self.stats.rollbacks += 1
        with self._shielded(), trio.move_on_after(
            min(5.0, self.statement_timeout_s)
        ):
            try:
                await conn.rollback()
            except BaseException:
                return False
            return True
        return False

    def _translate(self, exc: BaseException, name: str) -> Exception:
        code = _code(exc)
        message = exc.args[-1] if exc.args else repr(exc)
        if code in RETRYABLE_CODES:
            return _Retry(code)
        if code == DUPLICATE_KEY_CODE:
            return DuplicateKey(f"{name}: {message}")
        if code == PACKET_TOO_LARGE_CODE:
            # Measured before sending, so only when the limit fell since the last connect.
            return StatementTooLarge(
                f"{name}: the server refused a statement larger than its max_allowed_packet"
                f" ({code})", size=0, limit=self._max_statement_bytes)
        if code is not None and 2000 <= code < 3000:
            return DatabaseUnavailable(f"{name}: connection lost ({code})")
        if code in (1053, 1927):  # server shutdown, connection killed
            return DatabaseUnavailable(f"{name}: server went away ({code})")
        if code == NOT_READY_CODE:
            return DatabaseUnavailable(f"{name}: the server is not ready for clients ({code})"
                                       " (a cluster node joining, non-primary or refusing)")
        if code is not None and _server_reported(exc):
            # Codes whose text quotes the refused value (incorrect string / datetime /
            # integer value): the value stays out of the message (seed: no payload in
            # errors); the others name only columns and statements.
            said = "" if code in QUOTES_VALUE_CODES else f": {message}"
            return StorageRefused(f"{name}: mysql error {code}{said}", code=code)
        return StorageError(f"{name}: mysql error {code}: {message}")

    async def aclose(self) -> None:
        """Close the pool: a polite COM_QUIT per idle connection (at most 1 s in all,
        none once the abandon deadline has passed), then close every socket."""
        polite = trio.current_time() < self._abandon_at
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            while polite and self._idle:
                pooled = self._idle.pop()
                try:
                    with contextlib.suppress(Exception):
                        await pooled.conn.aclose()
                finally:
                    pooled.discard()
        while self._idle:
            self._idle.pop().discard()
