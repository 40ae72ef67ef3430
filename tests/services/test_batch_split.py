"""Issue 21, item 1: one request that the database cannot take never fails its batch.

The group-commit :class:`~daemon.services.batcher.Batcher` put every queued request into
one flush, and an error of that flush reached every request in it: one receipt larger than
the database takes in a statement failed the 199 concurrent deliveries it was batched with,
every time. Now a flush failing with an error of its statements is split down to the
request that causes it, which alone gets the error; and with ``weigh`` a batch is bounded
by bytes as well as by requests. Real stores on every backend; the gate only holds the
first flush so that the next requests queue into one batch, as under load.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import pytest
import trio

from daemon.services.batcher import Batcher
from storage.ingress.receipts import IngressReceipt, ReceiptInsert, ReceiptQuery
from storage.port import DatabaseUnavailable, StatementTooLarge, StorageError
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.ingress import receipt
from tests.support.work import T0

Flush = Callable[[Sequence[IngressReceipt]], Awaitable[Sequence[ReceiptInsert | StorageError]]]


def _gated(store: WorkStore, sizes: list[int], gate: trio.Event) -> Flush:
    async def flush(batch: Sequence[IngressReceipt]) -> Sequence[ReceiptInsert | StorageError]:
        sizes.append(len(batch))
        if len(sizes) == 1:
            await gate.wait()  # the first flush is in flight while the others queue
        return await store.ingress_receipts_insert(batch, T0)
    return flush


async def _submit_all(batcher: Batcher[IngressReceipt, ReceiptInsert],
                      receipts: list[IngressReceipt], gate: trio.Event
                      ) -> dict[str, object]:
    answers: dict[str, object] = {}
    all_answered = trio.Event()

    async def one(r: IngressReceipt) -> None:
        try:
            answers[r.receipt_id] = (await batcher.submit(r)).stored
        except StorageError as exc:
            answers[r.receipt_id] = type(exc).__name__
        if len(answers) == len(receipts) + 1:
            all_answered.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.run)
        nursery.start_soon(one, receipt(999))
        await trio.sleep(0.05)
        for r in receipts:
            nursery.start_soon(one, r)
        await trio.sleep(0.05)
        gate.set()
        with trio.fail_after(30):
            await all_answered.wait()
        nursery.cancel_scope.cancel()
    return answers


async def test_one_receipt_too_large_to_store_fails_alone_not_its_batch(
        database: FreshDatabase) -> None:
    store = await database.open_store(max_statement_bytes=100_000)
    sizes: list[int] = []
    splits: list[int] = []
    gate = trio.Event()
    batcher: Batcher[IngressReceipt, ReceiptInsert] = Batcher(
        _gated(store, sizes, gate), on_split=lambda: splits.append(1))
    receipts = [receipt(n) for n in range(6)]
    receipts.insert(3, receipt(50, body=b"L" * 300_000))
    answers = await _submit_all(batcher, receipts, gate)
    assert sizes[:2] == [1, 7]   # the seven queued behind the first: one batch
    assert answers == {"R" + "0" * 22 + "999": True,
                       **{r.receipt_id: True for r in receipts if len(r.body) < 1000},
                       receipts[3].receipt_id: StatementTooLarge.__name__}
    assert splits  # found by splitting, not by flushing each request alone
    stored = await store.ingress_receipt_list(ReceiptQuery(limit=50))
    assert len(stored) == 7 and all(len(r.body) < 1000 for r in stored)


async def test_a_batch_holds_at_most_max_bytes_of_requests(database: FreshDatabase) -> None:
    store = await database.open_store()
    sizes: list[int] = []
    gate = trio.Event()
    batcher: Batcher[IngressReceipt, ReceiptInsert] = Batcher(
        _gated(store, sizes, gate), weigh=lambda r: len(r.body), max_bytes=lambda: 100_000)
    receipts = [receipt(n, body=b"%06d" % n + b"b" * 39_994) for n in range(5)]
    answers = await _submit_all(batcher, receipts, gate)
    assert set(answers.values()) == {True}
    assert sizes == [1, 2, 2, 1]   # 40 KB each under a 100 KB budget


async def test_an_unreachable_database_is_not_split_on() -> None:
    """An error of the database's state reaches the whole batch at once: splitting would
    only multiply the attempts against a database that is down."""
    calls: list[int] = []

    async def flush(batch: Sequence[int]) -> Sequence[int | StorageError]:
        calls.append(len(batch))
        raise DatabaseUnavailable("down")

    batcher: Batcher[int, int] = Batcher(flush)
    with pytest.raises(DatabaseUnavailable):
        await batcher.submit(1)
    assert calls == [1]
    answers = await batcher._flush_split([1, 2, 3, 4])
    assert [type(a) for a in answers] == [DatabaseUnavailable] * 4 and calls == [1, 4]
