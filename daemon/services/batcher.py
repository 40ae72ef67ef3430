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
When the service is not running (tests, tools), ``submit`` flushes its own
request alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import attrs
import trio

from storage.port import StorageError

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
    _queue: list[_Pending[Req, Ans]] = attrs.field(factory=list)
    _has_work: trio.Event = attrs.field(factory=trio.Event)
    _running: bool = False

    async def submit(self, request: Req) -> Ans:
        """This request's answer; raises the ``StorageError`` it got."""
        if not self._running:
            (answer,) = await self.flush([request])
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
                batch = self._queue[: self.max_batch]
                del self._queue[: len(batch)]
                answers: Sequence[Ans | StorageError]
                try:
                    answers = await self.flush([p.request for p in batch])
                except StorageError as exc:
                    answers = [exc] * len(batch)
                for pending, answer in zip(batch, answers, strict=True):
                    pending.answer.append(answer)
                    pending.done.set()
        finally:
            self._running = False
            for pending in self._queue:  # stopping: nobody will carry these out
                pending.answer.append(StorageError("batcher stopped"))
                pending.done.set()


def _unwrap(answer: Ans | StorageError) -> Ans:
    if isinstance(answer, StorageError):
        raise answer
    return answer
