"""Group commit for dispatch-start checkpoints: many handlers, one transaction.

Each effect handler must commit its fenced checkpoint before a byte leaves,
which alone is one commit per effect. Handlers instead submit the checkpoint
here and wait; the batcher takes everything queued, writes it with one
``effect_checkpoint_many`` transaction (each request still checked against its
own fence and its command's state), and wakes each submitter with its own
answer. While one batch commits, the next one queues, so batches grow with
load and a lone checkpoint goes out at once.

A request whose handler was cancelled before its batch was taken is dropped;
one cancelled after that may still commit, which is the same as a crash just
after the checkpoint (the next claim reconciles, never resends blindly).
"""

from __future__ import annotations

import attrs
import trio

from daemon.core.work import Fence
from daemon.services.clock import Clock
from storage.effect_values import AttemptDraft
from storage.port import StorageError
from storage.work_store import WorkStore


@attrs.define(eq=False)
class _Request:
    fence: Fence
    draft: AttemptDraft
    done: trio.Event = attrs.field(factory=trio.Event)
    answer: str | StorageError | None = None
    abandoned: bool = False


@attrs.define(eq=False)
class CheckpointBatcher:
    store: WorkStore
    clock: Clock
    max_batch: int = 128
    _queue: list[_Request] = attrs.field(factory=list)
    _has_work: trio.Event = attrs.field(factory=trio.Event)
    _running: bool = False

    async def checkpoint(self, fence: Fence, draft: AttemptDraft) -> str:
        """The committed attempt id; raises what ``effect_checkpoint`` would raise."""
        if not self._running:  # not started (a test, a tool): commit on our own
            return await self.store.effect_checkpoint(fence, draft, self.clock.now_us())
        request = _Request(fence, draft)
        self._queue.append(request)
        self._has_work.set()
        try:
            await request.done.wait()
        except BaseException:
            request.abandoned = True
            raise
        if isinstance(request.answer, StorageError):
            raise request.answer
        assert request.answer is not None
        return request.answer

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._running = True
        try:
            task_status.started()
            while True:
                self._queue = [r for r in self._queue if not r.abandoned]
                if not self._queue:
                    self._has_work = trio.Event()
                    await self._has_work.wait()
                    continue
                batch = self._queue[: self.max_batch]
                del self._queue[: len(batch)]
                try:
                    answers = await self.store.effect_checkpoint_many(
                        [(r.fence, r.draft) for r in batch], self.clock.now_us())
                except StorageError as exc:
                    answers = [exc] * len(batch)
                for request, answer in zip(batch, answers, strict=True):
                    request.answer = answer
                    request.done.set()
        finally:
            self._running = False
            for request in self._queue:  # stopping: nobody will write these
                request.answer = StorageError("checkpoint batcher stopped")
                request.done.set()
