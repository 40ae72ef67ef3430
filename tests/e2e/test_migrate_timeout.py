"""A migration whose DDL takes longer than ``storage.statement_timeout`` completes.

Finding (production size, 20M ``work_executions`` rows on MariaDB): ``migrate`` ran each
migration's DDL under the ordinary statement timeout (15 s), so 0050's ``CREATE INDEX``
failed the command (``DatabaseUnavailable: migrate.apply.50: no answer to a statement
within 15s``) while the server went on building the index; ``schema_migrations`` row 50
stayed ``done = 0`` and the next ``migrate`` reported it "started but never finished".

Here the DDL is made slow deterministically: a second connection holds a metadata lock
on ``work_executions`` (an open transaction that read it), so 0050 waits for it; the lock
is released only once the server's process list shows the statement waiting longer than
the configured 1 s statement timeout. Real process, real MariaDB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import trio

from daemon.cli import EXIT_OK
from storage.migrate import load_migrations, migrate
from storage.port import SqlTx
from tests.support.backends import admin_execute, fresh_database
from tests.support.harness import wait_for
from tests.support.processes import ReplicaProcess, cli_env, run_cli, write_config
from tests.support.work import T0

pytestmark = [pytest.mark.slow, pytest.mark.mysql]

STATEMENT_TIMEOUT_MS = 1000


async def migrate_0050_behind_a_lock(tmp_path: Path, storage_extra: str
                                    ) -> tuple[CompletedProcess[str], str]:
    """Run ``integrationd migrate`` from 49 while a transaction holds ``work_executions``;
    release it once 0050 has waited past the statement timeout (or the command ended)."""
    async with fresh_database("mysql", tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()
        assert await migrate(store.db, store.dialect, T0, upto=49) == list(range(1, 50))
        database = tdb.url.rsplit("/", 1)[1]
        cfg = write_config(tmp_path / "a.toml", tdb.url, storage_extra=storage_extra)
        holding = trio.Event()
        release = trio.Event()

        async def hold_lock(tx: SqlTx) -> None:
            await tx.fetchall("SELECT COUNT(*) FROM work_executions")
            holding.set()
            await release.wait()

        async def waited_past_the_timeout() -> bool:
            if results:  # the command already gave up
                return True
            rows = await admin_execute(
                "SELECT TIME_MS FROM information_schema.PROCESSLIST WHERE DB = "
                f"'{database}' AND INFO LIKE 'CREATE INDEX work_executions_family_finished%'"
                " AND STATE = 'Waiting for table metadata lock'")
            return any(float(str(ms)) > 2 * STATEMENT_TIMEOUT_MS for (ms,) in rows)

        results: list[CompletedProcess[str]] = []

        async def run_migrate() -> None:
            results.append(await trio.to_thread.run_sync(run_cli, cfg, "migrate"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: store.db.transact(hold_lock, name="t.hold"))
            await holding.wait()
            nursery.start_soon(run_migrate)
            # The statement waits on the server past the client's statement timeout (or
            # the command already gave up), then the lock goes.
            await wait_for(waited_past_the_timeout, within_s=120)
            release.set()
        (result,) = results
        done = await admin_execute(
            f"SELECT done FROM {database}.schema_migrations WHERE version = 50")
        index = await admin_execute(
            f"SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = "
            f"'{database}' AND INDEX_NAME = 'work_executions_family_finished'")
        return result, f"done={done} index={int(str(index[0][0])) > 0}"


async def test_a_migration_slower_than_the_statement_timeout_completes(tmp_path: Path) -> None:
    result, state = await migrate_0050_behind_a_lock(
        tmp_path, f"statement_timeout = {STATEMENT_TIMEOUT_MS / 1000}")
    assert result.returncode == EXIT_OK, result.stderr
    assert "migrations applied: [50]" in result.stdout
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert {"version": 50, "migration": "work_executions_family_finished"}.items() <= next(
        e for e in events if e["event"] == "migration_applying").items()
    assert state == "done=[(1,)] index=True"


async def test_a_migration_past_the_migration_timeout_says_the_server_may_still_apply_it(
    tmp_path: Path,
) -> None:
    result, state = await migrate_0050_behind_a_lock(
        tmp_path, "statement_timeout = 1.0\nmigration_timeout = 1.0")
    assert result.returncode == 1, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert line.startswith(
        "integrationd: migration 50 (work_executions_family_finished) was interrupted"), line
    assert "may still be applying it" in line and "SHOW PROCESSLIST" in line, line
    assert "unreachable" not in line
    assert state.startswith("done=[(0,)]")  # never marked done: the operator decides


async def test_a_second_migrate_waits_the_migration_timeout_for_the_first(
    tmp_path: Path,
) -> None:
    """Several replicas' ExecStartPre: the one that did not claim 0050 waits for the one
    applying it as long as that one may take (storage.migration_timeout), not 60 s."""
    async with fresh_database("mysql", tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()
        await migrate(store.db, store.dialect, T0, upto=49)
        m50 = load_migrations()[49]
        await store.db.transact(lambda tx: tx.execute(  # claimed by "another replica"
            "INSERT INTO schema_migrations (version, name, checksum, done, applied_at_us)"
            " VALUES (50, ?, ?, 0, ?)", (m50.name, m50.checksum, T0)), name="t.claim")
        cfg = write_config(tmp_path / "b.toml", tdb.url,
                           storage_extra="statement_timeout = 1.0\nmigration_timeout = 5400")
        log = tmp_path / "b.log"
        with log.open("wb") as handle:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "daemon.cli", "--config", str(cfg), "migrate"],
                stdout=subprocess.DEVNULL, stderr=handle, cwd=str(tmp_path), env=cli_env())
        second = ReplicaProcess(proc, log)
        try:
            waiting = await second.wait_event("migration_waiting", within_s=60)
            assert (waiting["version"], waiting["within_s"]) == (50, 5400.0)
            await store.db.transact(lambda tx: tx.execute(  # the other one finished
                "UPDATE schema_migrations SET done = 1 WHERE version = 50"), name="t.done")
            assert await second.wait() == EXIT_OK, log.read_text()
        finally:
            if proc.returncode is None:
                second.kill()
                await second.wait()
