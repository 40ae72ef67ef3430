"""Conformance: versioned migrations, concurrent migrators, schema checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from storage.dialect import MYSQL, SQLITE
from storage.migrate import EXPECTED_VERSION, check_schema, migrate, schema_version
from storage.port import SchemaMismatch
from tests.support.backends import fresh_database
from tests.support.work import T0


async def test_concurrent_migrators_apply_each_version_once(backend: str,
                                                            tmp_path: Path) -> None:
    async with fresh_database(backend, tmp_path, migrated=False) as tdb:
        stores = [await tdb.open_store() for _ in range(3)]
        with pytest.raises(SchemaMismatch, match="run `integrationd migrate`"):
            await check_schema(stores[0].db, stores[0].dialect)
        applied: list[list[int]] = []

        async def run(i: int) -> None:
            applied.append(await migrate(stores[i].db, stores[i].dialect, T0))

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(run, i)
        assert sorted(v for a in applied for v in a) == list(range(1, EXPECTED_VERSION + 1))
        await check_schema(stores[0].db, stores[0].dialect)
        assert await schema_version(stores[0].db, stores[0].dialect) == EXPECTED_VERSION
        assert await migrate(stores[0].db, stores[0].dialect, T0) == []


async def test_changed_migration_is_detected(backend: str, tmp_path: Path) -> None:
    async with fresh_database(backend, tmp_path, clone=False) as tdb:
        store = await tdb.open_store()
        await store.db.transact(
            lambda tx: tx.execute("UPDATE schema_migrations SET checksum = 'x' WHERE version = 1"),
            name="t",
        )
        with pytest.raises(SchemaMismatch, match="differs"):
            await check_schema(store.db, store.dialect)
        with pytest.raises(SchemaMismatch, match="differs"):
            await migrate(store.db, store.dialect, T0)


async def test_newer_schema_is_refused(backend: str, tmp_path: Path) -> None:
    async with fresh_database(backend, tmp_path, clone=False) as tdb:
        store = await tdb.open_store()
        await store.db.transact(
            lambda tx: tx.execute(
                "INSERT INTO schema_migrations (version, name, checksum, done, applied_at_us)"
                " VALUES (999, 'future', 'x', 1, 0)"),
            name="t",
        )
        with pytest.raises(SchemaMismatch, match="newer than this build"):
            await check_schema(store.db, store.dialect)


async def test_unfinished_migration_is_reported(backend: str, tmp_path: Path) -> None:
    async with fresh_database(backend, tmp_path, clone=False) as tdb:
        store = await tdb.open_store()
        await store.db.transact(
            lambda tx: tx.execute("UPDATE schema_migrations SET done = 0 WHERE version = 1"),
            name="t",
        )
        with pytest.raises(SchemaMismatch, match="started but never finished"):
            await migrate(store.db, store.dialect, T0, wait_s=0.3)


def test_a_statement_may_be_one_backends_only() -> None:
    script = ("-- a comment\nCREATE TABLE t (k {KEY}(8));\n"
              "{MYSQL} ALTER TABLE t MODIFY k {KEY}(8) NOT NULL;\n{SQLITE} SELECT 1;")
    assert SQLITE.render_ddl(script) == ["CREATE TABLE t (k TEXT)", "SELECT 1"]
    assert MYSQL.render_ddl(script)[1:] == [
        "ALTER TABLE t MODIFY k VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"]
