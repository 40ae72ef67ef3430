"""Conformance: a parameter comes back exactly as it was written, on every backend.

The MySQL adapter formats the common parameter types itself (``literal_for``) instead of
through the driver's escaping calls: every byte the driver escapes, and the values
around the inline path's edges (bools, ints beyond 64 bits, None), are written by
``execute`` and by ``executemany`` and read back unchanged.
"""

from __future__ import annotations

import pytest
from trio_mysql.converters import escape_string

from storage.mysql.adapter import _ESCAPES, _ESCAPES_LIST, MysqlDatabase, literal_for
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import backend_params

# Keys that need escaping (NUL, backslash, LF, CR, ^Z, both quotes), that look like
# placeholders or format directives, and that are not ASCII.
AWKWARD = ["plain", "it's", 'say "hi"', "back\\slash", "nul\0byte", "line\nfeed",
           "carriage\rreturn", "ctrl\032z", "100%", "%s and %%", "why?", "?", "",
           "naïve ✓ 𝄞", "\\'", "'; DROP TABLE work_source_lanes; --"]
# The counter column: ints at the edges, a bool (the driver writes 0/1), None.
COUNTS: list[int | bool | None] = [0, -1, 2**63 - 1, -(2**63), True, False, None]


async def _rows(store: WorkStore) -> dict[str, int | None]:
    async def body(tx: SqlTx) -> dict[str, int | None]:
        rows = await tx.fetchall("SELECT source_lane, next_seq FROM work_source_lanes")
        return {str(r[0]): None if r[1] is None else int(r[1]) for r in rows}

    return await store.db.transact(body, name="test.values", write=False)


def test_the_inline_escape_table_is_the_drivers() -> None:
    every = "".join(chr(c) for c in range(0x250)) + "𝄞"
    assert every.translate(_ESCAPES) == escape_string(every)
    assert every.translate(_ESCAPES_LIST) == escape_string(every)


async def test_every_awkward_value_round_trips(store: WorkStore) -> None:
    single = [(f"one {key}", n) for key, n in zip(AWKWARD, range(len(AWKWARD)), strict=True)]
    many = [(f"many {key}", n) for key, n in zip(AWKWARD, range(len(AWKWARD)), strict=True)]

    async def body(tx: SqlTx) -> int:
        for row in single:
            await tx.execute("INSERT INTO work_source_lanes (source_lane, next_seq)"
                             " VALUES (?, ?)", row)
        return await tx.executemany("INSERT INTO work_source_lanes (source_lane, next_seq)"
                                    " VALUES (?, ?)", many)

    assert await store.db.transact(body, name="test.values") == len(many)
    assert await _rows(store) == dict(single + many)

    async def lookup(tx: SqlTx) -> list[str]:
        found: list[str] = []
        for key in AWKWARD:  # each key finds exactly its own row as a WHERE parameter
            rows = await tx.fetchall("SELECT source_lane FROM work_source_lanes"
                                     " WHERE source_lane = ?", (f"one {key}",))
            found.extend(str(r[0]) for r in rows)
        return found

    assert await store.db.transact(lookup, name="test.values", write=False) == [
        f"one {key}" for key in AWKWARD]


async def test_ints_bools_and_none_round_trip(store: WorkStore) -> None:
    async def body(tx: SqlTx) -> None:
        await tx.execute("CREATE TABLE IF NOT EXISTS test_counts (k VARCHAR(8) NOT NULL"
                         " PRIMARY KEY, n BIGINT NULL)")
        for i, count in enumerate(COUNTS):
            await tx.execute("INSERT INTO test_counts (k, n) VALUES (?, ?)", (f"one{i}", count))
        await tx.executemany("INSERT INTO test_counts (k, n) VALUES (?, ?)",
                             [(f"many{i}", count) for i, count in enumerate(COUNTS)])

    await store.db.transact(body, name="test.values")

    async def read(tx: SqlTx) -> dict[str, int | None]:
        rows = await tx.fetchall("SELECT k, n FROM test_counts")
        return {str(r[0]): None if r[1] is None else int(r[1]) for r in rows}

    expected = [None if c is None else int(c) for c in COUNTS]
    assert await store.db.transact(read, name="test.values", write=False) == {
        **{f"one{i}": n for i, n in enumerate(expected)},
        **{f"many{i}": n for i, n in enumerate(expected)}}


@pytest.mark.parametrize("backend", backend_params(("mysql",)), indirect=True)
async def test_the_inline_literal_is_the_drivers(store: WorkStore) -> None:
    """Every character, alone and inside printable ASCII, and the awkward keys: the
    adapter's literal (whose printable-ASCII path escapes nothing) is the driver's."""
    db = store.db
    assert isinstance(db, MysqlDatabase)
    pooled = await db._connect()
    try:
        literal = literal_for(pooled.conn)
        values = [*AWKWARD, *(chr(c) for c in range(0x250)),
                  *(f"id-{chr(c)}-x" for c in range(0x250)), "𝄞", "naïve"]
        assert [literal(v) for v in values] == [pooled.conn.literal(v) for v in values]
    finally:
        pooled.discard()
