"""Migration 0048 (history_rollup keyed by org, binding and operation) is upgrade-safe:
the table is rebuilt with its rows copied under no key (''), so every count a previous
build wrote reads back the same, and that build's INSERT (without the new columns) still
works beside this one (the columns default to '')."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.history import BUCKET_US, ExecutionFilter, HistoryPoint
from storage.migrate import EXPECTED_VERSION, migrate
from storage.port import SqlTx
from tests.support.backends import backend_params, fresh_database
from tests.support.work import T0

KEYED = 48
M0 = T0 - T0 % BUCKET_US


# The DDL differs per dialect, not between MariaDB and Galera (CI time).
@pytest.mark.parametrize("backend", backend_params(["sqlite", "mysql"]))
async def test_the_rollup_keeps_its_counts_across_the_keyed_rebuild(
        backend: str, tmp_path: Path) -> None:
    assert EXPECTED_VERSION >= KEYED
    async with fresh_database(backend, tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()
        await migrate(store.db, store.dialect, T0, upto=KEYED - 1)
        old_insert = ("INSERT INTO history_rollup (level_us, bucket_us, family, outcome,"
                      " shard, executions) VALUES (?, ?, ?, ?, ?, ?)")

        async def old_build(tx: SqlTx) -> None:  # rows as 0039's writer left them
            await tx.executemany(old_insert, [
                (BUCKET_US, M0, "external_effect", "succeeded", 0, 5),
                (BUCKET_US, M0, "external_effect", "succeeded", 2, 3),
                (BUCKET_US, M0, "noop", "dead", 1, 2)])

        await store.db.transact(old_build, name="test.old_rows")
        assert await migrate(store.db, store.dialect, T0, upto=KEYED) == [KEYED]
        assert await store.history_outcomes(M0, M0 + BUCKET_US, BUCKET_US) == [
            HistoryPoint(M0, "external_effect", "succeeded", 8),
            HistoryPoint(M0, "noop", "dead", 2)]
        # Copied under no key: a binding filter does not count them.
        assert await store.history_outcomes(M0, M0 + BUCKET_US, BUCKET_US,
                                            where=ExecutionFilter(binding="b")) == []

        async def keys(tx: SqlTx) -> set[tuple[str, str, str]]:
            return {(str(o), str(b), str(p)) for o, b, p in await tx.fetchall(
                "SELECT org_id, binding_id, operation FROM history_rollup")}

        assert await store.db.transact(keys, name="test.keys", write=False) == {("", "", "")}

        # A replica of the previous build, still running, inserts without the new columns.
        async def old_write(tx: SqlTx) -> None:
            await tx.execute(old_insert, (BUCKET_US, M0 + BUCKET_US, "noop", "dead", 0, 1))

        await store.db.transact(old_write, name="test.old_write")
        assert await store.history_outcomes(M0 + BUCKET_US, M0 + 2 * BUCKET_US, BUCKET_US) == [
            HistoryPoint(M0 + BUCKET_US, "noop", "dead", 1)]
