"""``cutover rollback`` on SQLite while a frozen process holds the write lock (issue 21,
item 5): what SQLite can say.

SQLite has one writer and shows no other connection's transaction, so the holder
cannot be named from the database itself. What the step can say is that the lock
stayed held past ``storage.statement_timeout`` and which claim-capable processes
stopped heartbeating (the frozen one is among them) -- one line, the stable code
``write_lock_held``, instead of "sqlite stayed busy". The holder here is a real OS
process frozen inside a write transaction, beside a replica row whose heartbeats
stopped when it froze.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import trio

from config.settings import ReplicaSettings, Settings, StorageSettings
from daemon.core.cutover import Phase
from daemon.services import cutover
from storage.cutover.values import CutoverBlocked, StepParams
from storage.port import ReplicaInfo, SqlTx
from storage.sqlite.adapter import SqliteDatabase
from storage.work_store import WorkStore
from tests.admin.support import operators
from tests.support.backends import FreshDatabase, backend_params
from tests.support.work import enqueue

HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE work_items SET row_version = row_version WHERE family = 'noop'")
print("held", flush=True)
time.sleep(600)
"""
SEC = 1_000_000


@pytest.fixture(params=backend_params(("sqlite",)))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_rollback_on_sqlite_says_the_write_lock_is_held_and_names_the_silent_replica(
    database: FreshDatabase, store: WorkStore,
) -> None:
    assert database.sqlite_path is not None
    wall = time.time_ns() // 1000
    await enqueue(store, 2, now=wall - SEC, source_lane=None)
    await store.cutover_begin(StepParams(family="noop", actor="ada", reason="t"), wall)

    async def owned(tx: SqlTx) -> None:
        await tx.execute("UPDATE owner_generations SET phase = 'integrationd_active',"
                         " claimant = 'integrationd', admission_closed_at_us = NULL"
                         " WHERE family = 'noop'")

    await store.db.transact(owned, name="t.owned")
    for rid, seen_s_ago in (("r-frozen", 40), ("r-fine", 0)):
        await store.replica_heartbeat(ReplicaInfo(
            replica_id=rid, hostname="h", pid=1, version="t", state="running",
            families='["noop"]', started_at_us=wall - 60 * SEC,
            heartbeat_at_us=wall - seen_s_ago * SEC))
    short = await SqliteDatabase(database.sqlite_path, synchronous="NORMAL",
                                 retry_budget_s=1.0).open()
    impatient = WorkStore(short, short.dialect)
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", HOLD, database.sqlite_path], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        with trio.fail_after(30):
            assert (await holder.stdout.receive_some(16)).startswith(b"held")
        holder.send_signal(signal.SIGSTOP)  # frozen inside its write transaction
        # As the CLI opens its store: the lock wait is storage.statement_timeout.
        settings = Settings(operators=operators(),
                            storage=StorageSettings(statement_timeout=1.0),
                            replica=ReplicaSettings(heartbeat_interval=5.0))
        with pytest.raises(CutoverBlocked) as exc:
            await cutover.step(impatient, settings, "rollback",
                               StepParams(family="noop", actor="ada", reason="t"),
                               time.time_ns() // 1000)
        (blocker,) = exc.value.blockers
        assert blocker.code == "write_lock_held"
        assert "r-frozen" in blocker.sentence and "r-fine" not in blocker.sentence
        assert "for over 1 s" in blocker.sentence  # how long the step waited for the lock
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        await holder.wait()
        await short.aclose()
    gen = await store.owner_generation_get("noop")
    assert gen is not None and gen.phase is Phase.INTEGRATIOND_ACTIVE  # nothing moved
