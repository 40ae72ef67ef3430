"""The legacy outcome projector as a replica service (seed 11.1).

Every replica runs one: each pass projects every unprojected legacy outcome
receipt (:meth:`storage.cutover.legacy.LegacyOutcomes.legacy_project`; each
receipt is taken by exactly one projector in its own transaction), then
sleeps. Its state is the receipts table itself, so a replica killed between a
receipt's commit and its projection leaves the receipt for the next pass of
any replica. A database error is logged and the next pass tries again.
"""

from __future__ import annotations

import trio

from daemon.services import logs
from daemon.services.clock import Clock
from storage.port import StorageError
from storage.work_store import WorkStore

PASS_INTERVAL_S = 1.0


async def project_all(store: WorkStore, clock: Clock) -> int:
    """Project until nothing is left; how many receipts this call projected."""
    total = 0
    while True:
        report = await store.legacy_project(clock.now_us())
        if not report.projected:
            return total
        total += report.projected
        if report.conflict:
            logs.warn("legacy_outcome_conflict", conflicts=report.conflict)


async def run(store: WorkStore, clock: Clock, *, interval_s: float = PASS_INTERVAL_S,
              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        try:
            await project_all(store, clock)
        except StorageError as exc:
            logs.warn("legacy_projector_failed", error=str(exc))
        await trio.sleep(interval_s)
