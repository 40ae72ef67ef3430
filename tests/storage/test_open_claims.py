"""Naming a claim transaction a frozen process left open (storage/cutover/open_claims.py),
on MariaDB: the replica and its rows from a READ UNCOMMITTED read, the server's
connection from what the server reports live.

``information_schema.innodb_trx`` is not live: InnoDB serves it from a cache that it
refreshes only after 100 ms without readers, so while anything polls it faster (a
monitor, a test's watcher) it keeps showing an old snapshot, one from before the
frozen claim began. The refusal must still name the claim's connection.
"""

from __future__ import annotations

import re

import pytest
import trio
import trio_mysql

from storage.cutover.open_claims import find_open_claims, open_transactions
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, backend_params
from tests.support.mysql_conn import mysql_connect, mysql_rows
from tests.support.work import enqueue


@pytest.fixture(params=backend_params(("mysql",)))
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _poll_innodb_trx(conn: trio_mysql.connections.Connection, stop: trio.Event) -> None:
    """A monitor reading the transaction list every 20 ms (keeps InnoDB's cache old)."""
    while not stop.is_set():
        await mysql_rows(conn, "SELECT COUNT(*) FROM information_schema.innodb_trx")
        await trio.sleep(0.02)


async def test_an_open_claim_is_named_with_its_connection_while_a_monitor_polls(
    database: FreshDatabase, store: WorkStore,
) -> None:
    (item,) = await enqueue(store, 1, now=1, source_lane=None)
    frozen = await mysql_connect(database.url)
    monitor = await mysql_connect(database.url)
    try:
        # An idle transaction that claimed nothing is nobody's open claim.
        await mysql_rows(frozen, "BEGIN")
        await mysql_rows(frozen, "SELECT COUNT(*) FROM work_items")
        nobody = await find_open_claims(store.db, "noop", grace_s=0.1)
        assert nobody.owners == () and nobody.sessions == () and nobody.described() == ()
        await mysql_rows(frozen, "ROLLBACK")

        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_poll_innodb_trx, monitor, stop)
            await trio.sleep(0.3)  # the monitor's cache predates the claim
            ((connection_id,),) = await mysql_rows(frozen, "SELECT CONNECTION_ID()")
            await mysql_rows(frozen, "BEGIN")
            assert await mysql_rows(frozen, "UPDATE work_items SET state = 'processing',"
                                    " lease_owner = 'replica-frozen', lease_token = 'tok'"
                                    " WHERE work_id = %s", (item,)) == []
            # ... and the process that holds it stops: the transaction stays open.
            found = await find_open_claims(store.db, "noop", grace_s=0.3)
            stop.set()
        assert found.owners == ("replica-frozen",)
        assert found.items == 1
        (session,) = found.sessions
        assert re.fullmatch(rf"connection {connection_id} from 127\.0\.0\.1:\d+ idle in a"
                            r" transaction for \d+ s", session), session
        (line,) = found.described()
        assert line.startswith("replica replica-frozen holds 1 item claimed but uncommitted"
                               f" (server: connection {connection_id} from"), line
    finally:
        for conn in (frozen, monitor):
            with trio.CancelScope(shield=True):
                await conn.aclose()



STATUS = """------------
TRANSACTIONS
------------
Trx id counter 171372
LIST OF TRANSACTIONS FOR EACH SESSION:
---TRANSACTION 171330, ACTIVE 2 sec
2 lock struct(s), heap size 1128, 1 row lock(s), undo log entries 1
MariaDB thread id 3236, OS thread handle 140295915460288, query id 349526 127.0.0.1 root
---TRANSACTION (0x7f9945200380), not started
0 lock struct(s), heap size 1128, 0 row lock(s)
---TRANSACTION 170907, ACTIVE 16 sec inserting
mysql tables in use 1, locked 1
MariaDB thread id 3230, OS thread handle 131498855421632, query id 344552 127.0.0.1 root
---TRANSACTION 170999, ACTIVE 3 sec
1 lock struct(s), heap size 1128, 0 row lock(s)
---TRANSACTION 171000, ACTIVE 4 sec
MySQL thread id 7, OS thread handle 1, query id 3 localhost root
--------
FILE I/O
--------
"""


@pytest.mark.parametrize(("status", "expected"), [
    (STATUS, {3236: 2, 3230: 16, 7: 4}),  # a started transaction without a thread: none
    ("", {}),
    ("---TRANSACTION (0x7f99), not started\n0 lock struct(s)\n", {}),
    ("---TRANSACTION 5, ACTIVE 1 sec\nno thread line\n", {}),
])
def test_open_transactions_reads_the_monitors_list(status: str,
                                                   expected: dict[int, int]) -> None:
    assert open_transactions(status) == expected
