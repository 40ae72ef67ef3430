"""Conformance: rotated-out webhook secrets' retirement rows (CAS by row_version, a
retirement final) and the trace a copy verified with an older secret leaves on its
receipt, duplicates included, on every backend."""

from __future__ import annotations

import attrs
import pytest

from storage.port import SqlTx, WorkConflict
from storage.secret_retirements import (
    RetirementRow,
    delete_retirement,
    last_previous_secret_receipt,
    read_retirement,
    read_retirements,
    retired_previous_secrets,
    write_retirement,
)
from storage.work_store import WorkStore
from tests.support.ingress import receipt
from tests.support.work import T0

W = 23_000_000
ROW = RetirementRow(route="r", secret_generation=2, state="watching", watch_since_us=T0,
                    check_at_us=T0 + W, evidence={"run": "w1"})


async def test_a_watch_moves_by_cas_and_a_retirement_is_final(store: WorkStore) -> None:
    async def watch(tx: SqlTx) -> RetirementRow:
        return await write_retirement(tx, None, ROW, T0)

    first = await store.db.transact(watch, name="t")
    assert first.row_version == 1
    with pytest.raises(WorkConflict):  # a second replica's run watching too
        await store.db.transact(watch, name="t")

    async def retire(tx: SqlTx) -> RetirementRow:
        before = await read_retirement(tx, "r", 2)
        assert before == first
        return await write_retirement(tx, before, attrs.evolve(
            before, state="retired", retired_at_us=T0 + W), T0 + W)

    retired = await store.db.transact(retire, name="t")

    async def stale(tx: SqlTx) -> None:  # a run that read the watch before the retirement
        await write_retirement(tx, first, attrs.evolve(first, check_at_us=T0 + 2 * W), T0)

    with pytest.raises(WorkConflict):
        await store.db.transact(stale, name="t")

    async def unwatch(tx: SqlTx) -> None:
        await delete_retirement(tx, retired)

    with pytest.raises(ValueError, match="stays retired"):
        await store.db.transact(unwatch, name="t")

    async def read(tx: SqlTx) -> tuple[list[RetirementRow], set[tuple[str, int]]]:
        return await read_retirements(tx), await retired_previous_secrets(tx)

    rows, keys = await store.db.transact(read, name="t", write=False)
    assert [(r.state, r.retired_at_us, r.evidence) for r in rows] == [
        ("retired", T0 + W, {"run": "w1"})]
    assert keys == {("r", 2)}


async def test_a_watch_is_dropped_only_as_read(store: WorkStore) -> None:
    async def body(tx: SqlTx) -> RetirementRow:
        return await write_retirement(tx, None, ROW, T0)

    row = await store.db.transact(body, name="t")

    async def stale_drop(tx: SqlTx) -> None:
        await delete_retirement(tx, attrs.evolve(row, row_version=7))

    with pytest.raises(WorkConflict):
        await store.db.transact(stale_drop, name="t")

    async def drop(tx: SqlTx) -> list[RetirementRow]:
        await delete_retirement(tx, row)
        return await read_retirements(tx)

    assert await store.db.transact(drop, name="t") == []


async def test_an_older_secrets_copy_leaves_its_time_on_the_receipt_duplicates_too(
        store: WorkStore) -> None:
    async def last(since_us: int) -> int | None:
        async def body(tx: SqlTx) -> int | None:
            return await last_previous_secret_receipt(tx, "r", since_us, W)

        return await store.db.transact(body, name="t", write=False)

    new = receipt(1, at_us=T0)  # verified with the newest secret
    await store.ingress_receipt_insert(new, T0)
    assert await last(T0 - W) is None
    # The same event through the old subscription, signed with the previous secret.
    old_copy = attrs.evolve(receipt(2, key=new.dedup_key, at_us=T0 + 5),
                            verification="verified:1")
    result = await store.ingress_receipt_insert(old_copy, T0)
    assert not result.stored
    got = await store.ingress_receipt_get(new.receipt_id)
    assert got is not None and got.verification == "verified:0"  # the newest kept
    assert await last(T0) == T0 + 7
    assert await last(T0 + 8) is None  # before the window asked about
    # An event only the old subscription delivered: its own receipt, its own trace.
    alone = attrs.evolve(receipt(3, at_us=T0 + 10), verification="verified:1")
    await store.ingress_receipt_insert(alone, T0)
    assert await last(T0) == T0 + 13
    # A later copy with the newest secret does not erase the trace.
    await store.ingress_receipt_insert(receipt(4, key=alone.dedup_key, at_us=T0 + 20), T0)
    assert await last(T0) == T0 + 13
    # Another route's old-secret copies are not this route's.
    other = attrs.evolve(receipt(5, at_us=T0 + 30), route="r2", verification="verified:1")
    await store.ingress_receipt_insert(other, T0)
    assert await last(T0) == T0 + 13
