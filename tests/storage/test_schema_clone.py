"""A test's migrated database is a clone of the session's template (tests/support/backends.py):
it must be indistinguishable from a database the migrations themselves made, on every
backend, or every other test would run on a schema production never has.

The comparison reads the catalog the way an operator would (tables and their options,
columns, indexes, constraints, anything else a migration could create) and every row of
every table; on Galera it reads each node, so the clone's DDL is proved replicated too."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import trio

from storage.migrate import EXPECTED_VERSION
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import (
    MYSQL_URL,
    Dropper,
    FreshDatabase,
    admin_execute,
    fresh_database,
    schema_script,
)

# What the MySQL-family catalog says about a schema, minus the schema's own name.
_MYSQL_CATALOG = {
    "tables": "SELECT table_name, table_type, engine, row_format, table_collation,"
              " create_options, table_comment FROM information_schema.tables"
              " WHERE table_schema = DATABASE() ORDER BY table_name",
    "columns": "SELECT table_name, column_name, ordinal_position, column_default, is_nullable,"
               " data_type, column_type, character_maximum_length, numeric_precision,"
               " numeric_scale, datetime_precision, character_set_name, collation_name,"
               " column_key, extra, column_comment, is_generated, generation_expression"
               " FROM information_schema.columns WHERE table_schema = DATABASE()"
               " ORDER BY table_name, ordinal_position",
    "indexes": "SELECT table_name, index_name, non_unique, seq_in_index, column_name,"
               " collation, sub_part, packed, nullable, index_type, comment, index_comment"
               " FROM information_schema.statistics WHERE table_schema = DATABASE()"
               " ORDER BY table_name, index_name, seq_in_index",
    "constraints": "SELECT table_name, constraint_name, constraint_type"
                   " FROM information_schema.table_constraints"
                   " WHERE table_schema = DATABASE() ORDER BY table_name, constraint_name",
    "checks": "SELECT table_name, constraint_name, check_clause"
              " FROM information_schema.check_constraints"
              " WHERE constraint_schema = DATABASE() ORDER BY table_name, constraint_name",
    "triggers": "SELECT trigger_name, event_object_table, action_statement"
                " FROM information_schema.triggers WHERE trigger_schema = DATABASE()"
                " ORDER BY trigger_name",
    "routines": "SELECT routine_name, routine_type, routine_definition"
                " FROM information_schema.routines WHERE routine_schema = DATABASE()"
                " ORDER BY routine_name",
    "events": "SELECT event_name, event_definition FROM information_schema.events"
              " WHERE event_schema = DATABASE() ORDER BY event_name",
}

_SQLITE_CATALOG = {
    "objects": "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name",
    **{pragma: f"PRAGMA {pragma}" for pragma in (
        "user_version", "application_id", "journal_mode", "page_size", "auto_vacuum",
        "encoding")},
}


async def _fingerprint(store: WorkStore) -> dict[str, list[tuple[object, ...]]]:
    """The catalog's account of the schema, each table's definition and every row."""
    mysql = store.dialect.name == "mysql"

    async def read(tx: SqlTx) -> dict[str, list[tuple[object, ...]]]:
        out: dict[str, list[tuple[object, ...]]] = {}
        for what, sql in (_MYSQL_CATALOG if mysql else _SQLITE_CATALOG).items():
            out[what] = [tuple(row) for row in await tx.fetchall(sql)]
        tables = [str(row[0]) for row in out["tables"]] if mysql else [
            str(row[1]) for row in out["objects"] if row[0] == "table"]
        for table in tables:
            if mysql:
                out[f"create {table}"] = [
                    tuple(row) for row in await tx.fetchall(f"SHOW CREATE TABLE `{table}`")]
            out[f"rows {table}"] = sorted(
                (tuple(row) for row in await tx.fetchall(f"SELECT * FROM {table}")), key=repr)
        return out

    return await store.db.transact(read, name="test.fingerprint", write=False)


async def _fingerprints(tdb: FreshDatabase) -> list[dict[str, list[tuple[object, ...]]]]:
    """One fingerprint per place a store can connect to (each Galera node)."""
    urls = tdb.node_urls or (None,)
    return [await _fingerprint(await tdb.open_store(url=url)) for url in urls]


async def test_a_cloned_database_is_the_migrated_one(backend: str, tmp_path: Path) -> None:
    for place in ("real", "clone"):
        (tmp_path / place).mkdir()
    async with fresh_database(backend, tmp_path / "real", clone=False) as real, \
            fresh_database(backend, tmp_path / "clone") as clone:
        migrated = await _fingerprints(real)
        cloned = await _fingerprints(clone)
    # Not vacuous: the fingerprint sees the tables and the ledger of every migration.
    assert sum(1 for key in migrated[0] if key.startswith("rows ")) >= 30
    assert len(migrated[0]["rows schema_migrations"]) == EXPECTED_VERSION
    for node, fingerprint in enumerate(cloned):
        for key in sorted(migrated[0].keys() | fingerprint.keys()):
            assert fingerprint.get(key) == migrated[0].get(key), f"node {node}: {key}"
    for node, fingerprint in enumerate(migrated[1:], start=1):
        assert fingerprint == migrated[0], f"node {node} of the migrated database"


@pytest.mark.mysql
async def test_a_schema_with_more_than_tables_is_refused(tmp_path: Path) -> None:
    """A migration that one day creates a view (or trigger, routine, event) must not be
    silently missing from every clone: the capture refuses it."""
    async with fresh_database("mysql", tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()

        async def create(tx: SqlTx) -> None:
            await tx.execute("CREATE TABLE t (k INTEGER NOT NULL PRIMARY KEY)")
            await tx.execute("CREATE VIEW v AS SELECT k FROM t")

        await store.db.transact(create, name="test.create")
        with pytest.raises(RuntimeError, match=r"\['VIEW v'\]: a clone copies tables and rows"):
            await schema_script(tdb.url)


@pytest.mark.mysql
async def test_the_dropper_drops_every_database_and_reports_one_it_could_not() -> None:
    """A finished test's database is dropped on the dropper's thread; a drop that fails
    (here: a name the server refuses) is reported by ``wait``, never lost with the thread."""
    dropper = Dropper()
    name = f"itest_{secrets.token_hex(6)}"
    await admin_execute(f"CREATE DATABASE {name}")
    await dropper.drop(name, MYSQL_URL)
    await dropper.drop("no such database", MYSQL_URL)
    with pytest.raises(RuntimeError, match=r"1 test databases were not dropped.*no such"):
        await trio.to_thread.run_sync(dropper.wait)
    assert await admin_execute(
        f"SELECT schema_name FROM information_schema.schemata WHERE schema_name = '{name}'"
    ) == []
    dropper.wait()  # reported once: the dropper goes on
