"""The console's view of provider quota keys (seed 9): each key's budget and state.

One row per quota key: the limit and window it enforces, its schedule (theoretical
arrival time, block from the last 429), what it has granted and given back, and how many
reservations are in flight (reserved, not yet sent or released).
"""

from __future__ import annotations

from typing import Any

from storage.work_store import WorkStore

Json = dict[str, Any]

NO_KEYS = ("No quota key has been used yet: no L1 definition declares a [quota.*]"
           " dimension, or no effect has been dispatched under one.")


async def quota_json(store: WorkStore, prefix: str = "") -> Json:
    keys = await store.quota_keys(prefix)
    in_flight = await store.quota_reservations_in_flight()
    items = [{
        "quota_key": k.quota_key, "limit": k.limit_count, "window_us": k.window_us,
        "interval_us": k.interval_us, "tat_us": k.state.tat_us,
        "blocked_until_us": k.state.blocked_until_us, "granted_total": k.granted_total,
        "returned_total": k.returned_total, "throttles_total": k.throttles_total,
        "last_throttled_at_us": k.last_throttled_at_us or None,
        "reserved_in_flight": in_flight.get(k.quota_key, 0),
    } for k in keys]
    return {"configured": bool(items), "items": items,
            "message": "" if items else NO_KEYS}
