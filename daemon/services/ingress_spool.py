"""IngressSpool: the replica's local, durable fallback for receipts the database could not
take within the ingress deadline.

Theory of operation
-------------------
A provider that does not redeliver after an HTTP error (L1 ``redelivery =
"network_failure_only"``) loses every event we answer with 503. So when the database
cannot make a receipt durable within ``ingress.db_deadline``, ingress appends the receipt
here and still answers 200; the :class:`SpoolForwarder` moves it into the database later,
under the same receipt id and dedup key, so forwarding twice (a crash after the INSERT,
before the segment is removed) writes nothing twice.

On disk: ``<spool_dir>/segment-<ulid>.spool`` files, append-only. Each record is
``MAGIC | length (4 bytes, big-endian) | SHA-256 of the payload (32 bytes) | payload``
(the payload is the receipt as JSON, its raw body in base64), written and ``fsync``-ed
before :meth:`IngressSpool.append` returns; a new segment's directory entry is fsynced too.
A torn tail (a crash mid-append, which was never answered 200) fails its checksum and is
dropped; a bad record before the tail stops the segment, which is renamed ``.bad`` and
counted, so nothing unreadable is silently deleted. A record the database refuses for
good (larger than one statement may be: never the case for a receipt ingress refused with
413, but the database's limit may have been lowered since) does not stop the forwarder:
its segment is kept as ``.held`` and the records after it are forwarded.

The forwarder *seals* the active segment (new appends go to a new one), forwards every
record of every sealed segment, then unlinks it. A restart finds the segments left and
forwards them. Full: above ``spool_max_bytes`` (or when the disk refuses a write) an
append raises :class:`SpoolFull`, and then, and only then, ingress answers 503.

What this trades (docs/operations.md): a receipt in the spool lives on one host's disk
until it is forwarded; losing that host with its disk before then loses those deliveries.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from daemon.services import logs
from storage.idgen import new_ulid
from storage.ingress.receipts import IngressReceipt
from storage.port import StorageError, deterministic

MAGIC = b"IGS1"
_HEADER = struct.Struct(">4sI32s")
SUFFIX = ".spool"


class SpoolFull(Exception):
    """The spool cannot take this receipt (over its size limit, or the disk refused)."""


def encode_record(receipt: IngressReceipt) -> bytes:
    payload = json.dumps({
        "receipt_id": receipt.receipt_id, "dedup_key": receipt.dedup_key,
        "route": receipt.route, "binding_id": receipt.binding_id, "webhook": receipt.webhook,
        "subscription_generation": receipt.subscription_generation,
        "received_at_us": receipt.received_at_us,
        "body": base64.b64encode(receipt.body).decode(), "body_sha256": receipt.body_sha256,
        "headers": receipt.headers, "verification": receipt.verification,
        "replica_id": receipt.replica_id,
    }, sort_keys=True).encode()
    return _HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload


def decode_records(data: bytes) -> tuple[list[IngressReceipt], int]:
    """Every intact record from the start of ``data``, and the offset where they end
    (``len(data)`` when the whole segment is intact)."""
    out: list[IngressReceipt] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        magic, length, digest = _HEADER.unpack_from(data, offset)
        start = offset + _HEADER.size
        payload = data[start:start + length]
        if magic != MAGIC or len(payload) != length or hashlib.sha256(payload).digest() != digest:
            break
        try:
            raw: dict[str, Any] = json.loads(payload)
            out.append(IngressReceipt(
                receipt_id=raw["receipt_id"], dedup_key=raw["dedup_key"], route=raw["route"],
                binding_id=raw["binding_id"], webhook=raw["webhook"],
                subscription_generation=int(raw["subscription_generation"]),
                received_at_us=int(raw["received_at_us"]),
                body=base64.b64decode(raw["body"]), body_sha256=raw["body_sha256"],
                headers=dict(raw["headers"]), verification=raw["verification"],
                via="spool", replica_id=raw["replica_id"],
            ))
        except (ValueError, KeyError, TypeError):
            break
        offset = start + length
    return out, offset


def torn_tail(data: bytes, end: int) -> bool:
    """Whether the bytes after ``end`` (where intact records stop) are only an unfinished
    last record (a crash mid-append: never answered 200), rather than damage."""
    rest = len(data) - end
    if rest == 0:
        return True
    if rest < _HEADER.size:
        return data[end:end + len(MAGIC)] == MAGIC[:min(rest, len(MAGIC))]
    magic, length, _ = _HEADER.unpack_from(data, end)
    return bool(magic == MAGIC and end + _HEADER.size + length > len(data))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@attrs.define(eq=False)
class _Append:
    receipt: IngressReceipt
    record: bytes
    done: trio.Event = attrs.field(factory=trio.Event)
    error: str | None = None


@attrs.define(eq=False)
class IngressSpool:
    directory: Path
    max_bytes: int
    # Called with the new depth and oldest received time (None: empty) after each change.
    on_change: Callable[[int, int | None], None] = lambda depth, oldest: None
    _lock: trio.Lock = attrs.field(factory=trio.Lock)
    _active: Path | None = None
    _bytes: int = 0
    # receipt id -> received_at_us, for every record not yet forwarded
    _pending: dict[str, int] = attrs.field(factory=dict)
    _queue: list[_Append] = attrs.field(factory=list)
    _queued_bytes: int = 0
    _writing: bool = False
    bad_segments: int = 0
    writes: int = 0          # write + fsync rounds (group commit: fewer than appends)

    def open(self) -> None:
        """Create the directory and account for the segments a previous run left."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._bytes = 0
        self._pending.clear()
        for segment in self.segments():
            data = segment.read_bytes()
            self._bytes += len(data)
            for r in decode_records(data)[0]:
                self._pending[r.receipt_id] = r.received_at_us
        self._changed()

    def segments(self) -> list[Path]:
        return sorted(self.directory.glob(f"segment-*{SUFFIX}"))

    @property
    def depth(self) -> int:
        return len(self._pending)

    @property
    def oldest_us(self) -> int | None:
        return min(self._pending.values(), default=None)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def _changed(self) -> None:
        self.on_change(self.depth, self.oldest_us)

    def _write(self, path: Path, records: bytes, new: bool) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            written = os.write(fd, records)
            if written != len(records):
                raise OSError("short write to the ingress spool")
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            _fsync_dir(path.parent)

    async def append(self, receipt: IngressReceipt, now_us: int) -> None:
        """Make ``receipt`` durable on local disk, or raise :class:`SpoolFull`.

        Group commit: appends that arrive while a write is in flight are written together
        with one ``fsync``; the first waiting task writes for all (shielded: once taken,
        a batch is always carried out, even if the task that writes it has timed out)."""
        record = encode_record(receipt)
        if self._bytes + self._queued_bytes + len(record) > self.max_bytes:
            raise SpoolFull(f"the ingress spool holds {self._bytes} bytes"
                            f" (ingress.spool_max_bytes {self.max_bytes})")
        waiter = _Append(receipt, record)
        self._queue.append(waiter)
        self._queued_bytes += len(record)
        if not self._writing:
            self._writing = True
            try:
                with trio.CancelScope(shield=True):
                    while self._queue:
                        batch, self._queue = self._queue, []
                        await self._write_batch(batch, now_us)
            finally:
                self._writing = False
        await waiter.done.wait()
        if waiter.error is not None:
            raise SpoolFull(f"the ingress spool could not write: {waiter.error}")

    async def _write_batch(self, batch: list[_Append], now_us: int) -> None:
        data = b"".join(a.record for a in batch)
        async with self._lock:
            new = self._active is None
            if self._active is None:
                self._active = self.directory / f"segment-{new_ulid(now_us)}{SUFFIX}"
            path = self._active
            error: str | None = None
            try:
                await trio.to_thread.run_sync(self._write, path, data, new)
            except OSError as exc:
                # The records may be partly on disk: a torn tail the reader drops. Start a
                # new segment so nothing is appended after it.
                self._active = None
                error = exc.strerror or str(exc)
            self._queued_bytes -= len(data)
            self.writes += 1
            if error is None:
                self._bytes += len(data)
                for a in batch:
                    self._pending[a.receipt.receipt_id] = a.receipt.received_at_us
                self._changed()
            for a in batch:
                a.error = error
                a.done.set()

    async def seal(self) -> list[Path]:
        """Close the active segment; every segment on disk is then ready to forward."""
        async with self._lock:
            self._active = None
            return self.segments()

    def forwarded(self, segment: Path, receipts: list[IngressReceipt], size: int) -> None:
        segment.unlink()
        _fsync_dir(segment.parent)
        self._bytes = max(0, self._bytes - size)
        for r in receipts:
            self._pending.pop(r.receipt_id, None)
        self._changed()

    def set_aside(self, segment: Path, size: int, receipts: list[IngressReceipt],
                  suffix: str = ".bad") -> None:
        """A segment with an unreadable record before its end: kept as ``.bad``; one with a
        record the database refuses for good (larger than a statement may be): ``.held``."""
        segment.rename(segment.with_suffix(suffix))
        self.bad_segments += 1
        self._bytes = max(0, self._bytes - size)
        for r in receipts:
            self._pending.pop(r.receipt_id, None)
        self._changed()


@attrs.define(eq=False)
class SpoolForwarder:
    """Moves sealed spool segments into the database, idempotently."""

    spool: IngressSpool
    # Make one receipt durable in the database (duplicates included); raises on failure.
    insert: Callable[[IngressReceipt], Awaitable[object]]
    interval_s: float = 1.0
    on_forwarded: Callable[[int], None] = lambda count: None
    on_error: Callable[[str], None] = lambda error: None

    async def forward_once(self) -> int:
        """Forward every segment on disk; the number of receipts moved. A database error
        stops at the segment it happened in (kept whole, tried again next time)."""
        moved = 0
        for segment in await self.spool.seal():
            data = await trio.to_thread.run_sync(segment.read_bytes)
            receipts, end = decode_records(data)
            held = 0
            for receipt in receipts:
                try:
                    await self.insert(receipt)
                except StorageError as exc:
                    if not deterministic(exc):
                        raise
                    # Answered 200, and the database will never take it as it is: kept on
                    # disk (the segment is set aside, not deleted), the others go on.
                    held += 1
                    logs.warn("ingress_spool_record_unstorable", segment=segment.name,
                              receipt=receipt.receipt_id, error=str(exc)[:300])
            if held:
                self.spool.set_aside(segment, len(data), receipts, suffix=".held")
            elif not torn_tail(data, end):
                logs.warn("ingress_spool_bad_segment", segment=segment.name,
                          records=len(receipts), unreadable_bytes=len(data) - end)
                self.spool.set_aside(segment, len(data), receipts)
            else:
                self.spool.forwarded(segment, receipts, len(data))
            moved += len(receipts)
            self.on_forwarded(len(receipts))
        return moved

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            if self.spool.depth or self.spool.segments():
                try:
                    moved = await self.forward_once()
                    if moved:
                        logs.event("ingress_spool_forwarded", receipts=moved,
                                   depth=self.spool.depth)
                except Exception as exc:  # storage errors: try again later
                    self.on_error(type(exc).__name__)
                    logs.warn("ingress_spool_forward_failed", error=str(exc)[:300],
                              depth=self.spool.depth)
            await trio.sleep(self.interval_s)
