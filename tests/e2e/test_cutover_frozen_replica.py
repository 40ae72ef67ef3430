"""``integrationd cutover rollback`` against a replica frozen inside its claim transaction
(issue 21, item 5), real processes on MariaDB.

A replica (``integrationd run``) claims an item whose row this test holds, so that
its claim UPDATE waits; the test freezes the replica (SIGSTOP) right there and
lets its statement finish on the server: the replica's claim transaction is open,
holding the row, and will never commit on its own.
The operator's rollback must not wait on those row locks until a statement
timeout: it refuses in one line naming the frozen replica and its open claim
transaction. Once the replica is stopped for good (SIGKILL: the server rolls its
transaction back), the rollback goes through.
"""

from __future__ import annotations

import functools
import re
import signal
import subprocess
from pathlib import Path

import pytest
import trio
import trio_mysql

from daemon.core.cutover import Phase
from sandbox.legacy import store as legacy
from storage.mysql.adapter import MysqlTarget
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, backend_params
from tests.support.cutover import params, states
from tests.support.harness import wait_for
from tests.support.legacy import sandbox_claimant
from tests.support.processes import run_cli, start_replica, stop_all, write_config
from tests.support.work import enqueue

pytestmark = pytest.mark.slow
STATEMENT_TIMEOUT_S = 3.0  # [storage] statement_timeout of every process here
ADMIN = '\n[[operators]]\nname = "ada"\nrole = "admin"\n'


@pytest.fixture(params=backend_params(("mysql",)))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _connect(url: str) -> trio_mysql.connections.Connection:
    t = MysqlTarget.from_url(url)
    conn = trio_mysql.connect(host=t.host, port=t.port, user=t.user, password=t.password,
                              database=t.database, autocommit=True)
    await conn.connect()
    return conn


async def _rows(conn: trio_mysql.connections.Connection, sql: str,
                args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    cur = conn.cursor()
    await cur.execute(sql, args)
    return list(await cur.fetchall())


# This database's transactions (the server is shared with other tests' databases).
OURS = (" FROM information_schema.innodb_trx t JOIN information_schema.processlist p"
        " ON p.id = t.trx_mysql_thread_id WHERE p.db = DATABASE()")


async def _rollback(cfg: Path) -> subprocess.CompletedProcess[str]:
    return await trio.to_thread.run_sync(functools.partial(
        run_cli, cfg, "cutover", "rollback", "noop", "--actor", "ada", "--reason",
        "frozen replica", "--claim-tx-bound", "0.5"))


async def test_rollback_names_a_replica_frozen_inside_its_claim_transaction(
    database: FreshDatabase, store: WorkStore, tmp_path: Path,
) -> None:
    await legacy.install(store)
    await store.cutover_begin(params(), 1)
    await store.cutover_commit(params(), 2, sandbox_claimant())
    cfg = write_config(tmp_path / "r.toml", database.url, extra=ADMIN,
                       storage_extra=f"statement_timeout = {STATEMENT_TIMEOUT_S}")
    replica = await start_replica(cfg, "frozen")
    replica_id = str((await replica.wait_event("replica_started"))["replica"])
    holder = await _connect(database.url)
    watcher = await _connect(database.url)
    try:
        replica.proc.send_signal(signal.SIGSTOP)
        (item,) = await enqueue(store, 1, now=1, source_lane=None)
        # Hold the row: the replica's claim UPDATE waits for it.
        await _rows(holder, "BEGIN")
        await _rows(holder, "UPDATE work_items SET row_version = row_version WHERE work_id = %s",
                    (item,))
        (holding,) = await _rows(holder, "SELECT trx_id FROM information_schema.innodb_trx"
                                 " WHERE trx_mysql_thread_id = CONNECTION_ID()")
        replica.proc.send_signal(signal.SIGCONT)

        async def claim_waits() -> bool:  # on the row this test holds
            return bool(await _rows(watcher, "SELECT requesting_trx_id FROM"
                                    " information_schema.innodb_lock_waits"
                                    " WHERE blocking_trx_id = %s", holding))

        await wait_for(claim_waits, within_s=30)
        replica.proc.send_signal(signal.SIGSTOP)  # frozen inside its claim transaction
        await _rows(holder, "ROLLBACK")  # its UPDATE now completes on the server
        async def claim_holds_it() -> bool:
            return not await claim_waits()

        await wait_for(claim_holds_it, within_s=30)
        assert await states(store) == {"pending": 1}  # nothing committed

        # The frozen claim holds the row, uncommitted, under the replica's name.
        await _rows(watcher, "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
        assert await _rows(watcher, "SELECT work_id, state, lease_owner FROM work_items") == [
            (item.encode(), b"processing", replica_id.encode())]

        # The first rollback closes admission, and already names the open claim.
        first_try = await _rollback(cfg)
        assert first_try.returncode == 1, first_try.stderr
        assert "[admission_recently_closed]" in first_try.stderr
        assert "[open_claim_transaction]" in first_try.stderr
        await trio.sleep(0.6)  # past the claim-transaction bound of the command
        result = await _rollback(cfg)
        assert result.returncode == 1, result.stderr
        errors = [x for x in result.stderr.splitlines() if not x.startswith("{")]
        assert len(errors) == 1, errors
        (line,) = errors
        assert "[open_claim_transaction]" in line and replica_id in line, line
        assert "holds 1 item claimed but uncommitted" in line, line
        # ... and the server's view of it: the connection to KILL if the host is gone.
        assert re.search(r"connection \d+ from 127\.0\.0\.1:\d+ idle in a transaction"
                         r" for \d+ s", line), line
        assert "no answer" not in result.stderr  # it never waited on the row locks
        gen = await store.owner_generation_get("noop")
        assert gen is not None and gen.phase is Phase.ROLLBACK_DRAINING
        assert [r.kind for r in await store.cutover_receipts("noop")] == ["cutover"]

        # Stopped for good, its transaction rolls back; proven gone, the rollback runs.
        replica.kill()
        await replica.wait()
        async def rolled_back() -> bool:
            return not await _rows(watcher, "SELECT t.trx_id" + OURS)

        await wait_for(rolled_back, within_s=30)
        done = await trio.to_thread.run_sync(functools.partial(
            run_cli, cfg, "cutover", "rollback", "noop", "--actor", "ada", "--reason",
            "frozen replica", "--claim-tx-bound", "0.5", "--gone", replica_id))
        assert done.returncode == 0, done.stderr
        assert await states(store) == {"awaiting_legacy_outcome": 1}
        assert await _fenced(store) == [item]
    finally:
        replica.proc.send_signal(signal.SIGCONT)
        await stop_all([replica])
        for conn in (holder, watcher):
            with trio.CancelScope(shield=True):
                await conn.aclose()


async def _fenced(store: WorkStore) -> list[str]:
    async def body(tx: SqlTx) -> list[str]:
        rows = await tx.fetchall("SELECT work_id FROM work_items"
                                 " WHERE state = 'awaiting_legacy_outcome'")
        return [str(r[0]) for r in rows]

    return await store.db.transact(body, name="t.fenced", write=False)
