"""The IngressSpool on a real local directory: fsynced append-only segments with
checksums, a torn tail dropped, a damaged segment set aside (never deleted), restarts,
the size limit, and idempotent forwarding into a real database."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from daemon.services.ingress_spool import (
    IngressSpool,
    SpoolForwarder,
    SpoolFull,
    decode_records,
    encode_record,
    torn_tail,
)
from storage.ingress.receipts import IngressReceipt, ReceiptQuery
from storage.work_store import WorkStore
from tests.support.ingress import receipt
from tests.support.work import T0


def test_records_round_trip_with_their_raw_bytes() -> None:
    r = receipt(1, body=b"\x00\xff\r\n raw")
    (back,), end = decode_records(encode_record(r) * 1)
    assert back.body == r.body and back.dedup_key == r.dedup_key and back.via == "spool"
    assert end == len(encode_record(r))


@pytest.mark.parametrize(("cut", "torn"), [(1, True), (10, True), (60, True)])
def test_a_torn_tail_is_only_an_unfinished_last_record(cut: int, torn: bool) -> None:
    data = encode_record(receipt(1)) + encode_record(receipt(2))[:cut]
    records, end = decode_records(data)
    assert len(records) == 1 and torn_tail(data, end) is torn


def test_a_damaged_record_is_not_a_torn_tail() -> None:
    second = bytearray(encode_record(receipt(2)))
    second[-1] ^= 0xFF   # complete length, wrong checksum
    data = encode_record(receipt(1)) + bytes(second) + encode_record(receipt(3))
    records, end = decode_records(data)
    assert len(records) == 1 and not torn_tail(data, end)


async def test_append_survives_a_restart_and_counts_depth(tmp_path: Path) -> None:
    seen: list[tuple[int, int | None]] = []
    spool = IngressSpool(tmp_path, 10**6, on_change=lambda d, o: seen.append((d, o)))
    spool.open()
    await spool.append(receipt(1), T0)
    await spool.append(receipt(2), T0)
    assert (spool.depth, spool.oldest_us) == (2, receipt(1).received_at_us)
    again = IngressSpool(tmp_path, 10**6)
    again.open()
    assert again.depth == 2 and again.size_bytes == spool.size_bytes
    assert seen[-1] == (2, receipt(1).received_at_us)


async def test_full_means_over_the_limit(tmp_path: Path) -> None:
    one = len(encode_record(receipt(1)))
    spool = IngressSpool(tmp_path, one * 2)
    spool.open()
    await spool.append(receipt(1), T0)
    await spool.append(receipt(2), T0)
    with pytest.raises(SpoolFull, match="spool_max_bytes"):
        await spool.append(receipt(3), T0)
    assert spool.depth == 2


async def test_a_disk_that_refuses_is_full_too(tmp_path: Path) -> None:
    spool = IngressSpool(tmp_path / "spool", 10**6)
    spool.open()
    (tmp_path / "spool").chmod(0o500)  # the directory refuses new segments
    try:
        import os
        if os.geteuid() == 0:
            # root ignores permissions: take the directory away instead.
            (tmp_path / "spool").chmod(0o700)
            (tmp_path / "spool").rmdir()
            (tmp_path / "spool").write_text("not a directory")
        with pytest.raises(SpoolFull, match="could not write"):
            await spool.append(receipt(1), T0)
    finally:
        if (tmp_path / "spool").is_dir():
            (tmp_path / "spool").chmod(0o700)


async def test_forwarding_is_idempotent_and_sets_damage_aside(
        store: WorkStore, tmp_path: Path) -> None:
    tmp_path = tmp_path / "spool"
    spool = IngressSpool(tmp_path, 10**6)
    spool.open()
    for n in range(3):
        await spool.append(receipt(n), T0)
    inserted: list[IngressReceipt] = []

    async def insert(r: IngressReceipt) -> object:
        inserted.append(r)
        return await store.ingress_receipt_insert(r, T0)

    forwarder = SpoolForwarder(spool, insert)
    # A crash after the INSERTs but before the segment went: it is forwarded again.
    (segment,) = await spool.seal()
    copy = segment.read_bytes()
    assert await forwarder.forward_once() == 3
    segment.write_bytes(copy)
    restarted = IngressSpool(tmp_path, 10**6)
    restarted.open()
    assert await SpoolForwarder(restarted, insert).forward_once() == 3
    receipts = await store.ingress_receipt_list(ReceiptQuery())
    assert len(receipts) == 3 and sum(r.duplicates for r in receipts) == 0
    assert restarted.depth == 0 and restarted.segments() == []

    # Damage before the end: what can be read is forwarded, the segment is kept aside.
    damaged = bytearray(encode_record(receipt(7)))
    damaged[-1] ^= 0xFF
    (tmp_path / "segment-00000000000000000000000000.spool").write_bytes(
        encode_record(receipt(6)) + bytes(damaged) + encode_record(receipt(8)))
    restarted.open()
    assert await SpoolForwarder(restarted, insert).forward_once() == 1
    assert [p.suffix for p in tmp_path.iterdir()] == [".bad"]
    assert restarted.bad_segments == 1


async def test_concurrent_appends_share_fsyncs_and_all_land(tmp_path: Path) -> None:
    spool = IngressSpool(tmp_path, 10**7)
    spool.open()
    async with trio.open_nursery() as nursery:
        for n in range(60):
            nursery.start_soon(spool.append, receipt(n), T0)
    assert spool.depth == 60 and spool.writes < 60
    records = [r for s in spool.segments() for r in decode_records(s.read_bytes())[0]]
    assert sorted(r.receipt_id for r in records) == sorted(receipt(n).receipt_id
                                                          for n in range(60))


async def test_a_waiter_that_gives_up_after_its_batch_was_taken_is_still_written(
        tmp_path: Path) -> None:
    spool = IngressSpool(tmp_path, 10**7)
    spool.open()

    async def impatient(n: int) -> None:
        with trio.move_on_after(0):
            await spool.append(receipt(n), T0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spool.append, receipt(0), T0)   # the writer
        for n in range(1, 5):
            nursery.start_soon(impatient, n)
    # Each either was never queued (cancelled before) or was written whole: no torn record.
    for segment in spool.segments():
        data = segment.read_bytes()
        assert decode_records(data)[1] == len(data)
    assert spool.depth == 5  # every queued record was carried out, waiter gone or not
