"""The legacy outcome projector service: it converges receipts written at any time."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from daemon.core.states import WorkState
from daemon.services import legacy_projector
from daemon.services.clock import TrioClock
from sandbox.legacy import store as legacy
from storage.cutover.legacy import LegacyOutcomeReceipt
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import fresh_database
from tests.support.cutover import params
from tests.support.harness import wait_for
from tests.support.legacy import sandbox_claimant


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[WorkStore]:
    """SQLite (MockClock's autojump would expire a MariaDB connect timeout); the
    projector's SQL is covered on both backends by tests/storage."""
    async with fresh_database("sqlite", tmp_path) as tdb:
        yield await tdb.open_store()


async def test_projector_service_reconciles_receipts_as_they_arrive(
    store: WorkStore, autojump_clock: object,
) -> None:
    clock = TrioClock()
    await legacy.install(store)
    await legacy.add_events(store, "noop", ["{}"] * 3, clock.now_us())
    await store.cutover_begin(params(), clock.now_us())
    await legacy.materialize(store, "noop", "org-1", clock.now_us())
    await store.cutover_commit(params(), clock.now_us(), sandbox_claimant())
    await store.cutover_rollback_begin(params(), clock.now_us())
    done = await store.cutover_rollback_commit(params(), clock.now_us())
    assert done.receipt is not None and done.receipt.fence_id is not None
    fence = done.receipt.fence_id
    items = await store.work_list(WorkQuery(state=WorkState.AWAITING_LEGACY_OUTCOME))
    assert len(items) == 3

    async def reconciled_at_least(n: int) -> bool:
        return len(await store.work_list(WorkQuery(
            state=WorkState.RECONCILED_LEGACY_TERMINAL))) >= n

    async with trio.open_nursery() as nursery:
        # Two projectors (two replicas): each receipt is projected exactly once.
        for _ in range(2):
            await nursery.start(legacy_projector.run, store, clock)
        for n, item in enumerate(items, start=1):
            await store.legacy_receipt_record(LegacyOutcomeReceipt(
                item.work_id, fence, 1, f"sha256:{n}", "succeeded"), clock.now_us())
            await wait_for(functools.partial(reconciled_at_least, n), within_s=30)
        nursery.cancel_scope.cancel()
    progress = (await store.legacy_fence_progress("noop"))[0]
    assert progress.confirmed and progress.reconciled == 3
    assert progress.receipts_conflicting == 0
