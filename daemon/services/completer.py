"""Batch finalization: many handlers' fenced transitions in one transaction.

Handlers submit a :class:`Finalization` and wait. The completer takes
everything queued, commits it with one ``work_finalize_if_owner`` call (each
row still checked against its own fence), and wakes the submitters with their
own result. Under load, submissions pile up while a flush is in flight, so
batches grow by themselves. Besides, a group commit: when the first submission finds
other handlers of the replica still running (a claimed batch's receipts finish a
millisecond or two apart), the flush waits at most ``linger_s`` for them, and goes as
soon as every running handler has submitted. Without that, ``bench.sql_tally`` counted
one replica's receipts finalized one to four at a time (280 transactions for about 1,000
finalizations of its quarter of the effects benchmark, six round trips each); a lone
handler, or a replica whose every handler has submitted, is flushed at once.

If the database is unreachable, the batch is kept and retried with backoff
for as long as each item's lease can still be trusted; an item whose trust
horizon passes is answered "not applied" (another replica will reclaim it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from daemon.core.outcomes import Finalization
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.metrics import Metrics
from storage.port import FinalizeResult, StorageError
from storage.work_claims import SideWrite
from storage.work_store import WorkStore

if TYPE_CHECKING:
    from daemon.services.worker_pool import InFlight


@attrs.define(eq=False)
class _Pending:
    finalization: Finalization
    flight: InFlight
    side_write: SideWrite | None
    done: trio.Event = attrs.field(factory=trio.Event)
    result: FinalizeResult | None = None


@attrs.define(eq=False)
class Completer:
    store: WorkStore
    clock: Clock
    metrics: Metrics
    replica_id: str
    max_batch: int = 512
    backoff_cap_s: float = 5.0
    linger_s: float = 0.0
    # How many handlers of the replica are running, those waiting here included (the
    # worker pool's flights): the group commit waits for the others to submit.
    handlers_running: Callable[[], int] = lambda: 0
    _queue: list[_Pending] = attrs.field(factory=list)
    _has_work: trio.Event = attrs.field(factory=trio.Event)
    _grown: trio.Event = attrs.field(factory=trio.Event)

    async def submit(self, finalization: Finalization, flight: InFlight,
                     side_write: SideWrite | None = None) -> FinalizeResult:
        pending = _Pending(finalization, flight, side_write)
        self._queue.append(pending)
        self._has_work.set()
        self._grown.set()
        await pending.done.wait()
        assert pending.result is not None
        return pending.result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        pause = 0.05
        while True:
            if not self._queue:
                self._has_work = trio.Event()
                await self._has_work.wait()
            await self._linger()
            batch = self._queue[: self.max_batch]
            del self._queue[: len(batch)]
            try:
                results = await self.store.work_finalize_if_owner(
                    [p.finalization for p in batch], self.replica_id, self.clock.now_us,
                    {p.finalization.fence.work_id: p.side_write for p in batch
                     if p.side_write is not None},
                )
            except StorageError as exc:
                self.metrics.db_errors.labels("finalize").inc()
                logs.warn("work_finalize_deferred", items=len(batch), error=str(exc))
                now = trio.current_time()
                keep = []
                for p in batch:
                    if p.flight.trusted_until > now:
                        keep.append(p)
                    else:
                        self._answer(p, FinalizeResult(p.finalization.fence, False, None))
                self._queue[:0] = keep
                await trio.sleep(pause)
                pause = min(pause * 2, self.backoff_cap_s)
                continue
            pause = 0.05
            for p, r in zip(batch, results, strict=True):
                self._answer(p, r)

    async def _linger(self) -> None:
        """The group commit: at most ``linger_s`` for the replica's other running handlers
        to submit too (a full batch, or every running handler in, goes at once)."""
        if self.linger_s <= 0:
            return
        with trio.move_on_after(self.linger_s):
            while len(self._queue) < min(self.max_batch, self.handlers_running()):
                self._grown = trio.Event()
                await self._grown.wait()

    @staticmethod
    def _answer(pending: _Pending, result: FinalizeResult) -> None:
        pending.result = result
        pending.done.set()
