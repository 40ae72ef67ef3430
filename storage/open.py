"""Open the configured backend from a storage URL, and wait for one still coming up."""

from __future__ import annotations

import random
from collections.abc import Callable

import trio

from daemon.core.retry import BackoffPolicy
from storage.mysql.adapter import MysqlDatabase, MysqlTarget
from storage.port import DatabaseUnavailable
from storage.sqlite.adapter import SqliteDatabase, sqlite_path_from_url
from storage.work_store import WorkStore

# Start-up tries: 0.5 s doubling to 5 s, full jitter (never below 0.25 s).
STARTUP_BACKOFF = BackoffPolicy(base_s=0.5, cap_s=5.0, floor_s=0.25)


def describe_url(url: str) -> str:
    """A storage URL with any password removed, for logs and errors."""
    if url.startswith("sqlite:"):
        return url
    try:
        return MysqlTarget.from_url(url).describe()
    except ValueError:
        return "<unparseable storage url>"


async def open_store(
    url: str,
    *,
    password: str | None = None,
    pool_size: int = 8,
    sqlite_synchronous: str = "FULL",
    base_dir: str | None = None,
    connect_timeout_s: float = 5.0,
    statement_timeout_s: float = 15.0,
    transaction_timeout_s: float = 30.0,
    connect: bool = True,
    create: bool = True,
) -> WorkStore:
    """Connect to ``url`` (``sqlite:///path`` or ``mysql://user@host:port/db``).

    ``connect=False`` builds a MySQL-family store without reaching the server
    (its first statement connects; :func:`wait_until_reachable` waits for it).
    A SQLite file is always opened: it is local, there is nothing to wait for;
    ``create=False`` refuses (``DatabaseRejected``) a file that does not exist yet.
    """
    if url.startswith("sqlite:"):
        sqlite_db = SqliteDatabase(
            sqlite_path_from_url(url, base=base_dir), synchronous=sqlite_synchronous,
            retry_budget_s=statement_timeout_s,
        )
        await sqlite_db.open(create=create)
        return WorkStore(sqlite_db, sqlite_db.dialect)
    mysql_db = MysqlDatabase(
        MysqlTarget.from_url(url, password), pool_size=pool_size,
        connect_timeout_s=connect_timeout_s, statement_timeout_s=statement_timeout_s,
        transaction_timeout_s=transaction_timeout_s,
    )
    if connect:
        await mysql_db.open()
    return WorkStore(mysql_db, mysql_db.dialect)


async def wait_until_reachable(
    store: WorkStore,
    *,
    timeout_s: float,
    on_retry: Callable[[int, float, str], None],
    sample: Callable[[], float] = random.random,
) -> int:
    """Ping until the database answers, with backoff, for at most ``timeout_s``.

    Calls ``on_retry(try_number, next_delay_s, error)`` after each failed try.
    :class:`~storage.port.DatabaseRejected` (wrong password, unknown database)
    is raised at once: waiting will not fix it. Returns the number of tries.
    """
    deadline = trio.current_time() + timeout_s
    tries = 0
    while True:
        tries += 1
        try:
            await store.db.ping()
            return tries
        except DatabaseUnavailable as exc:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise DatabaseUnavailable(
                    f"{exc} (still unreachable after {tries} tries in {timeout_s:g}s,"
                    " storage.startup_timeout)"
                ) from None
            delay = min(STARTUP_BACKOFF.delay_s(tries, sample()), remaining)
            on_retry(tries, delay, str(exc))
            await trio.sleep(delay)
