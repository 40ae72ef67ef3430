"""The sampler of the work queue's pressure for the console's history.

Every replica runs it; about one replica a minute writes the sample
(``daemon.core.pressure_sample`` says when this replica tries, and
``WorkStore.history_pressure_sample`` whether it wins the minute). A database error
skips that minute (a gap in the chart) and counts ``integrationd_db_errors_total
{operation="pressure_sample"}``; it never touches the work.
"""

from __future__ import annotations

import trio

from daemon.core.pressure_sample import MINUTE_US, minute_to_sample, offset_us
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.metrics import Metrics
from storage.port import StorageError
from storage.work_store import WorkStore

# How often the sampler looks at the clock: often enough to try within each minute after
# its offset (daemon.core.pressure_sample.SPREAD_US leaves 20 s).
POLL_S = 5.0


async def sample_pressure_once(store: WorkStore, clock: Clock, offset: int,
                               last_minute_us: int | None) -> int | None:
    """Try this minute if it is due; the last minute settled (sampled or found taken)."""
    now_us = clock.now_us()
    minute = minute_to_sample(now_us, last_minute_us, offset)
    if minute is None:
        return last_minute_us
    await store.history_pressure_sample(now_us)
    return minute


async def run_pressure_sampler(store: WorkStore, clock: Clock, metrics: Metrics,
                               replica_id: str, *,
                               task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                               ) -> None:
    task_status.started()
    offset = offset_us(replica_id)
    last: int | None = None
    while True:
        try:
            last = await sample_pressure_once(store, clock, offset, last)
        except StorageError as exc:
            metrics.db_errors.labels("pressure_sample").inc()
            logs.warn("pressure_sample_failed", error=str(exc))
            now_us = clock.now_us()
            last = now_us - now_us % MINUTE_US  # skip this minute: a gap, not a retry storm
        await trio.sleep(POLL_S)
