"""Conformance: ``SqlTx.executemany`` is one all-or-nothing write on every backend."""

from __future__ import annotations

import pytest

from storage.mysql import adapter as mysql_adapter
from storage.port import DuplicateKey, SqlTx
from storage.work_store import WorkStore

_INSERT = ("INSERT INTO work_source_lanes (source_lane, next_seq) VALUES (?, ?)")


async def _lanes(store: WorkStore) -> list[tuple[str, int]]:
    async def body(tx: SqlTx) -> list[tuple[str, int]]:
        rows = await tx.fetchall("SELECT source_lane, next_seq FROM work_source_lanes"
                                 " ORDER BY source_lane")
        return [(str(r[0]), int(r[1])) for r in rows]

    return await store.db.transact(body, name="test.lanes", write=False)


@pytest.mark.parametrize("chunk", [500, 2])  # one statement, or several under a savepoint
async def test_a_duplicate_row_writes_nothing_and_the_transaction_goes_on(
        store: WorkStore, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mysql_adapter, "MULTI_ROW_CHUNK", chunk)

    async def body(tx: SqlTx) -> int:
        await tx.execute(_INSERT, ("b", 1))
        with pytest.raises(DuplicateKey):
            await tx.executemany(_INSERT, [("a", 1), ("c", 1), ("d", 1), ("b", 2), ("e", 1)])
        # Literals in the VALUES tuple are repeated per row, too.
        return await tx.executemany(
            "INSERT INTO work_source_lanes (source_lane, next_seq) VALUES (?, 7)",
            [("x",), ("y",), ("z",)])

    assert await store.db.transact(body, name="test.executemany") == 3
    assert await _lanes(store) == [("b", 1), ("x", 7), ("y", 7), ("z", 7)]


async def test_many_rows_are_one_statement(store: WorkStore) -> None:
    before = store.db.stats.statements

    async def body(tx: SqlTx) -> int:
        return await tx.executemany(_INSERT, [(f"lane-{i:03}", i) for i in range(300)])

    assert await store.db.transact(body, name="test.executemany") == 300
    assert store.db.stats.statements == before + 1
    assert len(await _lanes(store)) == 300
