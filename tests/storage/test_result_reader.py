"""Conformance: a value comes back as it was written, whatever its length, and the MySQL
adapter's result reader (storage/mysql/wire.py) reads exactly what the driver's own does.

The lengths sit at the edges of the protocol's length prefixes (one byte up to 250, 0xFB
for NULL, two bytes from 251, three from 65,536) and past the driver's 16 KiB receive
chunk, where a packet arrives in pieces and the driver's own reader takes over.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio_mysql
from trio_mysql.constants import CLIENT

from storage.mysql.adapter import MysqlDatabase
from storage.mysql.wire import FastConnection
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import backend_params

LENGTHS = [0, 1, 250, 251, 252, 255, 256, 65_535, 65_536, 70_000]
INTS: list[int | None] = [0, -1, 250, 251, 65_536, 2**63 - 1, -(2**63), None]


def _text(n: int) -> str:
    return ("é✓x" * n)[:n]


def _rows() -> list[tuple[str, str | None, int | None]]:
    rows: list[tuple[str, str | None, int | None]] = [(f"len{n}", _text(n), n)
                                                      for n in LENGTHS]
    rows += [(f"int{i}", None, v) for i, v in enumerate(INTS)]
    return rows


async def _create(store: WorkStore) -> None:
    async def body(tx: SqlTx) -> None:
        await tx.execute("CREATE TABLE test_wire (k VARCHAR(16) NOT NULL PRIMARY KEY,"
                         " s LONGTEXT NULL, n BIGINT NULL)")
        await tx.executemany("INSERT INTO test_wire (k, s, n) VALUES (?, ?, ?)", _rows())

    await store.db.transact(body, name="test.wire")


async def test_values_at_every_length_prefix_come_back(store: WorkStore) -> None:
    await _create(store)

    async def read(tx: SqlTx) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await tx.fetchall("SELECT k, s, n FROM test_wire")]

    found = {r[0]: r for r in await store.db.transact(read, name="test.wire", write=False)}
    assert len(found) == len(_rows())
    for k, s, n in _rows():
        assert found[k][1:] == (s, n), k


# What the effect path reads (text, ints, NULLs), and every other kind of column the
# driver converts: decimals, floats, dates and times, JSON, binary strings, bits, an
# empty result, a statement's OK answer.
STATEMENTS = [
    "SELECT k, s, n, CAST(s AS BINARY) FROM test_wire ORDER BY k",
    "SELECT k, LENGTH(s), n DIV 2, n IS NULL FROM test_wire ORDER BY n, k",
    "SELECT 1, NULL, 1.5, CAST(1.25 AS DECIMAL(6,3)), CAST(2.5 AS DOUBLE), -7",
    "SELECT DATE '2026-12-06', TIME '12:34:56.5', TIMESTAMP '2026-12-06 12:00:00.123456',"
    " CAST('2026-01-02 03:04:05' AS DATETIME), YEAR('2026-05-05')",
    "SELECT JSON_OBJECT('a', 1, 'b', 'é'), x'00ff10', CAST('abc' AS BINARY), b'101',"
    " CAST(0.5 AS FLOAT)",
    "SELECT k FROM test_wire WHERE k = 'none'",
    "UPDATE test_wire SET n = n WHERE k = 'len0'",
]


async def _plain(db: MysqlDatabase) -> Any:
    """The driver's own connection, opened as the adapter opens its own."""
    t = db.target
    conn = trio_mysql.connect(host=t.host, port=t.port, user=t.user, password=t.password,
                              database=t.database, charset="utf8mb4", use_unicode=True,
                              client_flag=CLIENT.FOUND_ROWS, autocommit=True)
    await conn.connect()
    return conn


async def _answer(conn: Any, sql: str) -> tuple[Any, ...]:
    cur = conn.cursor()
    count = await cur.execute(sql)
    return count, cur.description, await cur.fetchall()


@pytest.mark.parametrize("backend", backend_params(("mysql", "galera")), indirect=True)
async def test_the_reader_reads_what_the_drivers_reads(store: WorkStore) -> None:
    await _create(store)
    db = store.db
    assert isinstance(db, MysqlDatabase)
    pooled = await db._connect()
    plain = await _plain(db)
    try:
        assert isinstance(pooled.conn, FastConnection)
        for sql in STATEMENTS:
            expected = await _answer(plain, sql)
            # Twice: the second reads every column descriptor from the cache.
            assert await _answer(pooled.conn, sql) == expected, sql
            assert await _answer(pooled.conn, sql) == expected, sql
    finally:
        pooled.discard()
        await plain.aclose()


@pytest.mark.parametrize("backend", backend_params(("mysql", "galera")), indirect=True)
async def test_an_error_answer_raises_and_leaves_the_connection_in_step(
        store: WorkStore) -> None:
    """An error packet before any row and one after the first rows (a scalar subquery
    that returns two rows from the second row on) raise the server's error; the
    connection then answers the next statement."""
    await _create(store)
    db = store.db
    assert isinstance(db, MysqlDatabase)
    pooled = await db._connect()
    plain = await _plain(db)
    midway = ("SELECT t.k, (SELECT u.k FROM test_wire u WHERE u.n >= t.n) FROM test_wire t"
              " WHERE t.n IS NOT NULL ORDER BY t.n DESC")
    try:
        for conn in (plain, pooled.conn):
            for sql, code in (("SELEC 1", 1064), (midway, 1242)):
                with pytest.raises(trio_mysql.MySQLError) as raised:
                    await _answer(conn, sql)
                assert raised.value.args[0] == code
                assert (await _answer(conn, "SELECT 1"))[2] == ((1,),)
    finally:
        pooled.discard()
        await plain.aclose()
