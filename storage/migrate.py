"""Versioned schema migrations, shared by every backend.

Each ``migrations/NNNN_name.sql`` file is applied once, in order. A migrator
first *claims* a version by inserting its row into ``schema_migrations``
(unique key), so several replicas starting at once apply each migration
exactly once; the others wait for it to be marked done. A migration that was
claimed but never finished (a crash mid-DDL on MySQL, where DDL is not
transactional) is reported, never silently re-run. A checksum catches an
applied migration whose file later changed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from importlib import resources

import attrs
import trio

from storage.dialect import Dialect
from storage.port import (
    Database,
    DatabaseUnavailable,
    DuplicateKey,
    SchemaMismatch,
    SqlTx,
    StorageError,
)


class MigrationInterrupted(StorageError):
    """A migration's DDL got no answer (or lost its connection): on a MySQL-family server
    it may still be running, and its ``schema_migrations`` row stays unfinished."""


@attrs.frozen
class Migration:
    version: int
    name: str
    script: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.script.encode()).hexdigest()


def load_migrations() -> list[Migration]:
    found = []
    for entry in resources.files("storage").joinpath("migrations").iterdir():
        if entry.name.endswith(".sql"):
            version_text, _, rest = entry.name.partition("_")
            found.append(Migration(int(version_text), rest[:-4], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migration versions must be 1..n without gaps: {versions}")
    return found


EXPECTED_VERSION = len(load_migrations())

_LEDGER = """CREATE TABLE schema_migrations (
    version INTEGER NOT NULL PRIMARY KEY,
    name {KEY}(128) NOT NULL,
    checksum {KEY}(64) NOT NULL,
    done INTEGER NOT NULL,
    applied_at_us BIGINT NOT NULL
) {OPTS}"""


async def _ledger_exists(db: Database, dialect: Dialect) -> bool:
    async def body(tx: SqlTx) -> bool:
        return bool(await tx.fetchall(dialect.table_exists_sql, ("schema_migrations",)))

    return await db.transact(body, name="migrate.ledger_exists", write=False)


async def _ensure_ledger(db: Database, dialect: Dialect) -> None:
    if await _ledger_exists(db, dialect):
        return
    (ddl,) = dialect.render_ddl(_LEDGER)

    async def create(tx: SqlTx) -> None:
        await tx.execute(ddl)

    # Another migrator may have created it first: the check below decides.
    with contextlib.suppress(StorageError):
        await db.transact(create, name="migrate.create_ledger")
    if not await _ledger_exists(db, dialect):
        raise SchemaMismatch("could not create schema_migrations")


async def applied_versions(db: Database, dialect: Dialect) -> dict[int, tuple[str, bool]]:
    """Version -> (checksum, done) for every claimed migration."""
    if not await _ledger_exists(db, dialect):
        return {}

    async def body(tx: SqlTx) -> dict[int, tuple[str, bool]]:
        rows = await tx.fetchall("SELECT version, checksum, done FROM schema_migrations")
        return {int(v): (str(c), bool(d)) for v, c, d in rows}

    return await db.transact(body, name="migrate.read", write=False)


async def schema_version(db: Database, dialect: Dialect) -> int:
    """The highest contiguous, finished migration version (0 for an empty database)."""
    applied = await applied_versions(db, dialect)
    version = 0
    while applied.get(version + 1, ("", False))[1]:
        version += 1
    return version


async def check_schema(db: Database, dialect: Dialect) -> None:
    """Raise :class:`SchemaMismatch` unless the schema is exactly this build's version."""
    applied = await applied_versions(db, dialect)
    for migration in load_migrations():
        state = applied.get(migration.version)
        if state is None or not state[1]:
            raise SchemaMismatch(
                f"database schema is missing migration {migration.version} ({migration.name}):"
                " run `integrationd migrate`"
            )
        if state[0] != migration.checksum:
            raise SchemaMismatch(
                f"migration {migration.version} ({migration.name}) differs from the one applied"
            )
    newer = [v for v in applied if v > EXPECTED_VERSION]
    if newer:
        raise SchemaMismatch(
            f"database schema has migrations {sorted(newer)} newer than this build knows"
        )


async def migrate(
    db: Database, dialect: Dialect, now_us: int, *, wait_s: float = 60.0,
    upto: int | None = None, applying: Callable[[Migration], None] = lambda m: None,
    waiting: Callable[[Migration], None] = lambda m: None, ddl_db: Database | None = None,
) -> list[int]:
    """Apply every pending migration (up to version ``upto``: a test of an upgrade
    sequence stops between steps); return the versions this call applied.

    ``wait_s`` is how long a migration another migrator claimed may take to finish;
    ``applying`` is told of each migration this call is about to apply (one may take
    minutes on a big table), ``waiting`` of each it waits for another migrator to finish.
    ``ddl_db`` (the same database, opened with a longer statement timeout) applies the
    migrations; ``db`` runs the ledger's short statements."""
    await _ensure_ledger(db, dialect)
    applied_now: list[int] = []
    for migration in load_migrations():
        if upto is not None and migration.version > upto:
            break
        state = (await applied_versions(db, dialect)).get(migration.version)
        if state is not None:
            if state[0] != migration.checksum:
                raise SchemaMismatch(
                    f"migration {migration.version} ({migration.name}) differs from the one"
                    " applied"
                )
            if not state[1]:
                waiting(migration)
                await _wait_done(db, dialect, migration, wait_s)
            continue
        if await _claim(db, migration, now_us):
            applying(migration)
            await _apply(ddl_db or db, dialect, migration)
            applied_now.append(migration.version)
        else:
            waiting(migration)
            await _wait_done(db, dialect, migration, wait_s)
    return applied_now


async def _claim(db: Database, migration: Migration, now_us: int) -> bool:
    async def body(tx: SqlTx) -> None:
        await tx.execute(
            "INSERT INTO schema_migrations (version, name, checksum, done, applied_at_us)"
            " VALUES (?, ?, ?, 0, ?)",
            (migration.version, migration.name, migration.checksum, now_us),
        )

    try:
        await db.transact(body, name="migrate.claim")
    except DuplicateKey:
        return False
    return True


async def _apply(db: Database, dialect: Dialect, migration: Migration) -> None:
    statements = dialect.render_ddl(migration.script)

    async def body(tx: SqlTx) -> None:
        for statement in statements:
            await tx.execute(statement)
        await tx.execute(
            "UPDATE schema_migrations SET done = 1 WHERE version = ?", (migration.version,)
        )

    try:
        await db.transact(body, name=f"migrate.apply.{migration.version}")
    except DatabaseUnavailable as exc:
        raise MigrationInterrupted(
            f"migration {migration.version} ({migration.name}) was interrupted ({exc});"
            " the server may still be applying it: wait until SHOW PROCESSLIST no longer"
            " lists it, then inspect the schema and set its schema_migrations row's done = 1"
            " if the change is there, else delete the row; then migrate again (with a longer"
            " storage.migration_timeout)"
        ) from None


async def _wait_done(db: Database, dialect: Dialect, migration: Migration, wait_s: float) -> None:
    with trio.move_on_after(wait_s):
        while True:
            state = (await applied_versions(db, dialect)).get(migration.version)
            if state is not None and state[1]:
                return
            await trio.sleep(0.2)
    raise SchemaMismatch(
        f"migration {migration.version} ({migration.name}) was started but never finished;"
        " inspect the schema, then delete its schema_migrations row to re-run it"
    )
