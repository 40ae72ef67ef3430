"""Issue 21, item 1: batched writes are bounded by bytes as well as rows (every backend).

MariaDB/MySQL close the connection on a statement larger than ``max_allowed_packet``
(16 MiB by default), which the client sees as "connection lost (2006)": a multi-row INSERT
of thirty ~1 MB receipts was one such statement, and failed the same way every time. The
adapter reads the server's limit at connect, cuts a batch into statements that fit, and
refuses a single row that cannot fit with :class:`StatementTooLarge` before sending it (the
transaction goes on). SQLite binds each row alone; its bound is one value's length
(``SQLITE_LIMIT_LENGTH``), which the store can lower, as MySQL's can be lowered below the
server's, for tests and proxies.
"""

from __future__ import annotations

import pytest

from storage.ingress.receipts import ReceiptQuery
from storage.port import SqlTx, StatementTooLarge
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.ingress import materialization, receipt
from tests.support.work import T0

BODY = 1_000_000


def _burst(store: WorkStore) -> int:
    """Enough ~1 MB receipts (4/3 of that as base64 in the row) for twice the server's
    statement limit on MySQL (30 at 16 MiB); 30 on SQLite, which binds rows one by one."""
    if store.db.backend == "sqlite":
        return 30
    return max(30, (2 * store.db.max_statement_bytes) // (BODY * 4 // 3) + 1)


async def test_a_burst_of_receipts_over_max_allowed_packet_is_stored_and_settled(
        store: WorkStore) -> None:
    if store.db.backend != "sqlite":
        # The server's own limit, read at connect (16 MiB: MariaDB's default here).
        async def packet(tx: SqlTx) -> int:
            return int(str((await tx.fetchall("SELECT @@max_allowed_packet"))[0][0]))

        assert store.db.max_statement_bytes < await store.db.transact(
            packet, name="test.packet", write=False)
    count = _burst(store)
    receipts = [receipt(n, body=b"%06d" % n + b"x" * (BODY - 6)) for n in range(count)]
    answers = await store.ingress_receipts_insert(receipts, T0)
    assert [getattr(a, "stored", a) for a in answers] == [True] * count
    stored = await store.ingress_receipt_list(ReceiptQuery(limit=500))
    assert sorted(r.body for r in stored) == sorted(r.body for r in receipts)
    # Their settlement writes as many bytes again (each event's attributes, each
    # WorkItem's change), in one call.
    settled = await store.ingress_settle(
        [materialization(r, filler="y" * BODY) for r in receipts], T0)
    assert settled == [True] * count
    counts = await store.ingress_counts()
    assert counts.by_state["materialized"] == count
    assert counts.by_state["received"] == 0


async def test_a_row_larger_than_the_statement_limit_is_refused_unsent_and_the_transaction_goes_on(
        database: FreshDatabase) -> None:
    store = await database.open_store(max_statement_bytes=200_000)
    assert store.db.max_statement_bytes == 200_000
    small = receipt(1)
    large = receipt(2, body=b"z" * 300_000)

    async def body(tx: SqlTx) -> str:
        with pytest.raises(StatementTooLarge) as refused:
            await tx.execute("INSERT INTO work_source_lanes (source_lane, next_seq)"
                             " VALUES (?, ?)", ("q" * 300_000, 1))
        with pytest.raises(StatementTooLarge):
            await tx.executemany("INSERT INTO work_source_lanes (source_lane, next_seq)"
                                 " VALUES (?, ?)", [("a", 1), ("q" * 300_000, 2)])
        await tx.execute("INSERT INTO work_source_lanes (source_lane, next_seq)"
                         " VALUES (?, ?)", ("b", 1))
        return str(refused.value)

    message = await store.db.transact(body, name="test.too_large")
    assert "larger than" in message and "q" * 20 not in message  # no payload in the error

    async def lanes(tx: SqlTx) -> list[str]:
        return [str(r[0]) for r in await tx.fetchall(
            "SELECT source_lane FROM work_source_lanes ORDER BY source_lane")]

    # Nothing of the refused batch was written (its small row included); the rest was.
    assert await store.db.transact(lanes, name="test.lanes", write=False) == ["b"]
    # Through the receipts' batched insert: the large receipt alone is refused.
    with pytest.raises(StatementTooLarge):
        await store.ingress_receipt_insert(large, T0)
    assert (await store.ingress_receipt_insert(small, T0)).stored


async def test_a_batch_is_cut_into_statements_that_each_fit(database: FreshDatabase) -> None:
    store = await database.open_store(max_statement_bytes=100_000)
    before = store.db.stats.statements
    receipts = [receipt(n, body=b"%06d" % n + b"w" * 29_994) for n in range(12)]
    answers = await store.ingress_receipts_insert(receipts, T0)
    assert [getattr(a, "stored", a) for a in answers] == [True] * 12
    stored = await store.ingress_receipt_list(ReceiptQuery(limit=50))
    assert sorted(r.body for r in stored) == sorted(r.body for r in receipts)
    if store.db.backend != "sqlite":
        # 12 rows of ~40 KB (base64) under a 100 KB bound: two rows a statement at most,
        # under one savepoint (SAVEPOINT, the INSERTs, RELEASE).
        assert store.db.stats.statements - before >= 6 + 2
