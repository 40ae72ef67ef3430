"""When a replica samples the work queue's pressure for the console's history.

Pure: every replica runs the sampler (storage/history_pressure.py); one sample a minute
is wanted, cluster-wide. Each replica tries at its own offset into the minute
(:func:`offset_us`, from its id, spread over the first :data:`SPREAD_US`), so one
replica usually finds the minute unsampled and the others find it taken (a primary-key
read each); two that try together are settled by the minute's primary key.
"""

from __future__ import annotations

import zlib

MINUTE_US = 60_000_000
# Offsets fall in the first 40 s, so a replica polling every 15 s still tries in time.
SPREAD_US = 40_000_000


def offset_us(replica_id: str) -> int:
    """This replica's offset into each minute, whole seconds in ``[0, SPREAD_US)``."""
    return zlib.crc32(replica_id.encode()) % (SPREAD_US // 1_000_000) * 1_000_000


def minute_to_sample(now_us: int, last_minute_us: int | None, offset: int) -> int | None:
    """The minute to try to sample now, or None: the minute was settled by this replica
    already (sampled, or found sampled), or it is before this replica's offset."""
    minute = now_us - now_us % MINUTE_US
    if last_minute_us is not None and minute <= last_minute_us:
        return None
    if now_us - minute < offset:
        return None
    return minute
