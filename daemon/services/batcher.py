"""Group commit for per-item database steps: many tasks' requests, one round trip.

A task submits a request and waits; the batcher's service task takes
everything queued, hands it to ``flush`` (one transaction or one read for
the lot) and wakes each submitter with its own answer, or with the error
``flush`` gave for that request alone. While one batch is in flight the next
one queues, so batches grow with load and a lone request goes out at once.

A request whose task was cancelled before its batch was taken is dropped;
one cancelled after that may still be carried out (callers only batch steps
for which that is the same as a crash just after the step). Errors of the
whole flush (database unreachable, unknown COMMIT) reach every submitter.

Bounded by bytes as well as by requests: with ``weigh`` (a request's bytes as it will be
written), a batch holds at most ``max_bytes()`` of them (at least one request), so a burst
of large requests is several transactions, never one the database cannot take. A flush
that fails as a whole with an error of its statements (:func:`storage.port.deterministic`:
a row larger than a statement may be, a value the server refuses) is split in halves and
each half flushed again, down to the one request that fails, which alone gets the error:
one bad request never fails the others. Errors of the database's state (unreachable, an
unknown COMMIT, contention) are never split on: they reach the whole batch, as before.
When the service is not running (tests, tools), ``submit`` flushes its own
request alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import attrs
import trio

from storage.port import StorageError, deterministic

Req = TypeVar("Req")
Ans = TypeVar("Ans")

Flush = Callable[[Sequence[Req]], Awaitable[Sequence[Ans | StorageError]]]


@attrs.define(eq=False)
class _Pending(Generic[Req, Ans]):
    request: Req
    done: trio.Event = attrs.field(factory=trio.Event)
    answer: list[Ans | StorageError] = attrs.field(factory=list)  # one, once answered
    abandoned: bool = False


@attrs.define(eq=False)
class Batcher(Generic[Req, Ans]):
    flush: Flush[Req, Ans]
    max_batch: int = 128
    # A request's size as written (None: only max_batch bounds a batch), and the bytes a
    # batch may hold (read at each batch: the database's limit is read at connect).
    weigh: Callable[[Req], int] | None = None
    max_bytes: Callable[[], int] = lambda: 16 * 1024 * 1024
    # Called once per split of a failed flush (a metric).
    on_split: Callable[[], None] = lambda: None
    _queue: list[_Pending[Req, Ans]] = attrs.field(factory=list)
    _has_work: trio.Event = attrs.field(factory=trio.Event)
    _running: bool = False

    async def submit(self, request: Req) -> Ans:
        """This request's answer; raises the ``StorageError`` it got."""
        if not self._running:
            (answer,) = await self._flush_split([request])
            return _unwrap(answer)
        pending: _Pending[Req, Ans] = _Pending(request)
        self._queue.append(pending)
        self._has_work.set()
        try:
            await pending.done.wait()
        except BaseException:
            pending.abandoned = True
            raise
        return _unwrap(pending.answer[0])

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._running = True
        try:
            task_status.started()
            while True:
                self._queue = [p for p in self._queue if not p.abandoned]
                if not self._queue:
                    self._has_work = trio.Event()
                    await self._has_work.wait()
                    continue
                batch = self._queue[: self._take()]
                del self._queue[: len(batch)]
                answers = await self._flush_split([p.request for p in batch])
                for pending, answer in zip(batch, answers, strict=True):
                    pending.answer.append(answer)
                    pending.done.set()
        finally:
            self._running = False
            for pending in self._queue:  # stopping: nobody will carry these out
                pending.answer.append(StorageError("batcher stopped"))
                pending.done.set()


    def _take(self) -> int:
        """How many queued requests the next batch holds (at least one)."""
        count = min(self.max_batch, len(self._queue))
        if self.weigh is None:
            return count
        budget = self.max_bytes()
        total = 0
        for n, pending in enumerate(self._queue[:count]):
            total += self.weigh(pending.request)
            if n and total > budget:
                return n
        return count

    async def _flush_split(self, requests: Sequence[Req]) -> Sequence[Ans | StorageError]:
        try:
            return await self.flush(requests)
        except StorageError as exc:
            if len(requests) == 1 or not deterministic(exc):
                return [exc] * len(requests)
        self.on_split()
        half = len(requests) // 2
        return [*await self._flush_split(requests[:half]),
                *await self._flush_split(requests[half:])]


def _unwrap(answer: Ans | StorageError) -> Ans:
    if isinstance(answer, StorageError):
        raise answer
    return answer
