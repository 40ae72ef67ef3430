"""Open the configured backend from a storage URL."""

from __future__ import annotations

from storage.mysql.adapter import MysqlDatabase, MysqlTarget
from storage.sqlite.adapter import SqliteDatabase, sqlite_path_from_url
from storage.work_store import WorkStore


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
) -> WorkStore:
    """Connect to ``url`` (``sqlite:///path`` or ``mysql://user@host:port/db``)."""
    if url.startswith("sqlite:"):
        sqlite_db = SqliteDatabase(
            sqlite_path_from_url(url, base=base_dir), synchronous=sqlite_synchronous
        )
        await sqlite_db.open()
        return WorkStore(sqlite_db, sqlite_db.dialect)
    mysql_db = MysqlDatabase(MysqlTarget.from_url(url, password), pool_size=pool_size)
    await mysql_db.open()
    return WorkStore(mysql_db, mysql_db.dialect)
