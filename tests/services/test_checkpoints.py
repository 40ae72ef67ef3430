"""The checkpoint batcher: concurrent handlers' checkpoints share one transaction."""

from __future__ import annotations

import trio
import trio.testing

from daemon.core.work import Fence
from daemon.services.checkpoints import CheckpointBatcher
from daemon.services.clock import TrioClock
from storage.port import LostLease, StorageError
from storage.work_store import WorkStore
from tests.support.commands import accept_pinned, attempt, draft
from tests.support.work import claim


async def _claimed(store: WorkStore, n: int) -> list[tuple[str, Fence]]:
    """``n`` commands (for lead-0 .. lead-n-1, every pin real), each claimed."""
    clock = TrioClock()
    ids = []
    for i in range(n):
        accepted = await accept_pinned(store, draft(f"int-{i}", lead=f"lead-{i}"),
                                       clock.now_us())
        assert accepted.command_id is not None
        ids.append(accepted.command_id)
    items = {i.subject_id: i for i in (await claim(store, family="external_effect",
                                                   now=clock.now_us())).claimed}
    out = []
    for command_id in ids:
        fence = items[command_id].fence
        assert fence is not None
        out.append((command_id, fence))
    return out


async def test_concurrent_checkpoints_commit_together(store: WorkStore) -> None:
    work = await _claimed(store, 8)
    batcher = CheckpointBatcher(store, TrioClock())
    answers: dict[str, str | StorageError] = {}

    async def one(command_id: str, fence: Fence, lead: str) -> None:
        try:
            answers[command_id] = await batcher.checkpoint(fence, attempt(command_id, lead))
        except StorageError as exc:
            answers[command_id] = exc

    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.batcher.run)
        commits = store.db.stats.commits
        async with trio.open_nursery() as handlers:
            for i, (command_id, fence) in enumerate(work[:7]):
                handlers.start_soon(one, command_id, fence, f"lead-{i}")
            stale = attempt(work[7][0], "lead-7")
            handlers.start_soon(one, work[7][0], Fence(work[7][1].work_id, "stale", 1),
                                "lead-7")
        assert store.db.stats.commits - commits <= 2  # not one commit per checkpoint
        nursery.cancel_scope.cancel()
    assert isinstance(answers[work[7][0]], LostLease)
    for command_id, _ in work[:7]:
        (row,) = await store.effect_attempts(command_id)
        assert row.attempt_id == answers[command_id]
    assert await store.effect_attempts(stale.command_id) == []


async def test_a_cancelled_handler_s_queued_checkpoint_is_dropped(store: WorkStore) -> None:
    [(command_id, fence)] = await _claimed(store, 1)
    batcher = CheckpointBatcher(store, TrioClock())
    batcher.batcher._running = True  # as if started, but not taking batches yet
    async with trio.open_nursery() as handler:
        handler.start_soon(batcher.checkpoint, fence, attempt(command_id, "lead-0"))
        await trio.testing.wait_all_tasks_blocked()  # queued, waiting for its batch
        handler.cancel_scope.cancel()
    async with trio.open_nursery() as nursery:
        await nursery.start(batcher.batcher.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert await store.effect_attempts(command_id) == []


async def test_without_the_service_each_checkpoint_commits_alone(store: WorkStore) -> None:
    [(command_id, fence)] = await _claimed(store, 1)
    attempt_id = await CheckpointBatcher(store, TrioClock()).checkpoint(
        fence, attempt(command_id, "lead-0"))
    (row,) = await store.effect_attempts(command_id)
    assert row.attempt_id == attempt_id
