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

The test watches the server through what it reports live: ``processlist`` (which
statement each connection runs) and a READ UNCOMMITTED read of the rows. Not
through ``innodb_lock_waits``/``innodb_trx``: InnoDB serves those from a cache it
refreshes only when nobody has read it for 100 ms, so a watcher polling every
50 ms kept reading a snapshot from before the claim waited (or from before the
holder let go), and this test timed out waiting for a wait that was there.
"""

from __future__ import annotations

import functools
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import trio
import trio_mysql

from config.load import load_settings
from daemon.core.cutover import Phase
from daemon.services import cutover
from daemon.services.families import known_family_names
from sandbox.legacy import store as legacy
from storage.cutover.values import StepParams
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, backend_params
from tests.support.cutover import params, states
from tests.support.harness import wait_for
from tests.support.legacy import sandbox_claimant
from tests.support.mysql_conn import mysql_connect, mysql_rows
from tests.support.processes import run_cli, start_replica, stop_all, write_config
from tests.support.work import enqueue

pytestmark = pytest.mark.slow
# [storage] statement_timeout of the operator's commands: a rollback that waits on
# the frozen claim's row locks fails after this with "no answer to a statement".
STATEMENT_TIMEOUT_S = 3.0
# The replica's: its claim waits on the row this test holds for as long as the test
# needs (the server's lock wait timeout is 50 s), never abandoned by the client.
REPLICA_STATEMENT_TIMEOUT_S = 30.0
ADMIN = '\n[[operators]]\nname = "ada"\nrole = "admin"\n'
OPERATOR = StepParams(family="noop", actor="ada", reason="frozen replica", claim_tx_bound_us=0)


def wall_us() -> int:
    return time.time_ns() // 1000


@pytest.fixture(params=backend_params(("mysql",)))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# The replica's claim statement, running on this database (the server is shared).
CLAIMING = ("SELECT id, command FROM information_schema.processlist WHERE db = DATABASE()"
            " AND info LIKE 'UPDATE work_items SET state = ''processing''%%'")


async def _claim_statement(watcher: trio_mysql.connections.Connection
                           ) -> tuple[object, ...] | None:
    rows = await mysql_rows(watcher, CLAIMING)
    assert len(rows) <= 1, rows  # one replica, one claim at a time
    return rows[0] if rows else None


async def _dirty(watcher: trio_mysql.connections.Connection) -> list[tuple[object, ...]]:
    """The rows as an open transaction left them (uncommitted writes included)."""
    await mysql_rows(watcher, "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")  # next one only
    return await mysql_rows(watcher, "SELECT work_id, state, lease_owner FROM work_items")


async def _rollback(cfg: Path) -> subprocess.CompletedProcess[str]:
    # A bound of 0: nothing but the open claim itself may block the step.
    return await trio.to_thread.run_sync(functools.partial(
        run_cli, cfg, "cutover", "rollback", "noop", "--actor", "ada", "--reason",
        "frozen replica", "--claim-tx-bound", "0"))


async def test_rollback_names_a_replica_frozen_inside_its_claim_transaction(
    database: FreshDatabase, store: WorkStore, tmp_path: Path,
) -> None:
    await legacy.install(store)
    await store.cutover_begin(params(), 1)
    await store.cutover_commit(params(), 2, sandbox_claimant())
    replica_cfg = write_config(tmp_path / "replica.toml", database.url, extra=ADMIN,
                               storage_extra=f"statement_timeout = {REPLICA_STATEMENT_TIMEOUT_S}")
    cfg = write_config(tmp_path / "operator.toml", database.url, extra=ADMIN,
                       storage_extra=f"statement_timeout = {STATEMENT_TIMEOUT_S}")
    replica = await start_replica(replica_cfg, "frozen")
    replica_id = str((await replica.wait_event("replica_started"))["replica"])
    holder = await mysql_connect(database.url)
    watcher = await mysql_connect(database.url)
    try:
        replica.proc.send_signal(signal.SIGSTOP)
        (item,) = await enqueue(store, 1, now=1, source_lane=None)
        # Hold the row: the replica's claim UPDATE waits for it.
        await mysql_rows(holder, "BEGIN")
        await mysql_rows(holder, "UPDATE work_items SET row_version = row_version"
                         " WHERE work_id = %s", (item,))
        replica.proc.send_signal(signal.SIGCONT)

        async def claim_waits() -> bool:  # on the row this test holds
            found = await _claim_statement(watcher)
            return found is not None and found[1] in ("Query", b"Query")

        await wait_for(claim_waits, within_s=30)
        claiming = await _claim_statement(watcher)
        assert claiming is not None
        replica.proc.send_signal(signal.SIGSTOP)  # frozen inside its claim transaction
        await mysql_rows(holder, "ROLLBACK")  # its UPDATE now completes on the server

        async def claim_holds_it() -> bool:  # its statement done, its transaction open
            return await _claim_statement(watcher) is None

        await wait_for(claim_holds_it, within_s=30)
        assert await states(store) == {"pending": 1}  # nothing committed
        # The frozen claim holds the row, uncommitted, under the replica's name.
        assert await _dirty(watcher) == [(item.encode(), b"processing", replica_id.encode())]

        # The operator's one command closes admission, then refuses the fence at once
        # (it never waits on the row locks), in one line naming the blocker.
        result = await _rollback(cfg)
        assert result.returncode == 1, result.stderr
        assert "no answer" not in result.stderr, result.stderr
        errors = [x for x in result.stderr.splitlines() if not x.startswith("{")]
        assert len(errors) == 1, errors
        (line,) = errors
        assert "[open_claim_transaction]" in line and replica_id in line, line
        assert "holds 1 item claimed but uncommitted" in line, line
        # ... and the server's view of it: the connection to KILL if the host is gone.
        assert re.search(rf"connection {claiming[0]} from 127\.0\.0\.1:\d+ idle in a"
                         r" transaction for \d+ s", line), line
        gen = await store.owner_generation_get("noop")
        assert gen is not None and gen.phase is Phase.ROLLBACK_DRAINING
        assert [r.kind for r in await store.cutover_receipts("noop")] == ["cutover"]

        # Stopped for good, its transaction rolls back; proven gone, the rollback runs.
        replica.kill()
        await replica.wait()

        async def rolled_back() -> bool:
            return await _dirty(watcher) == [(item.encode(), b"pending", None)]

        await wait_for(rolled_back, within_s=30)
        # (The step the command runs, in this process: one start-up of the CLI is enough.)
        settings = load_settings(str(cfg), known_families=known_family_names())
        done = await cutover.step(store, settings, "rollback", OPERATOR, wall_us(),
                                  gone=(replica_id,))
        assert done[-1].generation.phase is Phase.LEGACY_ACTIVE
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
