"""The console's view of provider quota keys (seed 9): each key's budget and state.

One row per quota key this replica's L1 dimensions and L2 bindings can count against
(shown before its first dispatch), and any other key the shared table holds: the limit
and window it enforces, the slots a grant could start now (its budget), its schedule
(theoretical arrival time, block from the last 429), what it has granted and given
back, how many reservations are in flight and how much work waits for a slot. The same
samples feed the ``integrationd_quota_*`` gauges (``daemon/services/quota_gauges.py``).
"""

from __future__ import annotations

import functools
from typing import Any

from config.catalog import CatalogError, load_definitions
from config.definitions import OperationDefinition
from config.settings import Settings
from daemon.core.quota_waits import waiting_since
from daemon.services.effect_quota import QuotaKey, declared_keys, waiting_key
from daemon.services.quota_gauges import sample_quota
from storage.bounded import BoundedCount
from storage.work_store import WorkStore

Json = dict[str, Any]

NO_KEYS = ("No quota key is configured: no L1 definition of a configured binding's"
           " provider declares a [quota.*] dimension, and no effect has been dispatched"
           " under one.")


@functools.cache
def _operations(definitions_dir: str) -> tuple[OperationDefinition, ...]:
    try:
        operations, _ = load_definitions(definitions_dir)
    except CatalogError:
        return ()  # the replica refused to start on it; nothing to declare here
    return tuple(operations.values())


def _declared(settings: Settings | None) -> dict[str, QuotaKey]:
    if settings is None:
        return {}
    return declared_keys(_operations(settings.catalog.definitions_dir), settings.bindings,
                         clock_spread_us=settings.work.clock_spread_us)


# Items held on quota read per page view: the oldest of each key with waiting work (at
# most WAITER_KEYS keys), and listed per key (the longest waiting first).
WAITERS_READ = 50
WAITER_KEYS = 20
WAITERS_SHOWN = 10


async def waiting_by_key(store: WorkStore, now_us: int, keys: list[str]
                         ) -> dict[str, list[Json]]:
    """Each quota key's held items, the longest waiting first: since when (its current
    run of quota deferrals began) and when it is tried next."""
    out: dict[str, list[Json]] = {}
    for w in await store.quota_waiters(WAITERS_READ, keys[:WAITER_KEYS]):
        key = waiting_key(w.summary)
        if key is None:
            continue
        since = waiting_since(w.journal)
        out.setdefault(key, []).append({
            "work_id": w.work_id, "family": w.family, "waiting_since_us": since,
            "waited_us": None if since is None else max(0, now_us - since),
            "next_try_us": w.run_after_us})
    for rows in out.values():
        rows.sort(key=lambda r: (r["waiting_since_us"] is None, r["waiting_since_us"] or 0))
    return out


async def quota_json(store: WorkStore, now_us: int, settings: Settings | None = None,
                     prefix: str = "") -> Json:
    samples = await sample_quota(store, _declared(settings), now_us)
    waiters = await waiting_by_key(store, now_us, [
        q.quota_key for q in samples if q.waiting and q.quota_key.startswith(prefix)])
    items = [{
        "quota_key": q.quota_key, "declared": q.declared, "limit": q.limit,
        "window_us": q.window_us, "kind": q.kind or None, "burst": q.burst or None,
        "budget": q.budget if q.declared else None, "tat_us": q.tat_us,
        "blocked_until_us": q.blocked_until_us or None, "granted_total": q.granted_total,
        "returned_total": q.returned_total, "throttles_total": q.throttles_total,
        "last_throttled_at_us": q.last_throttled_at_us or None,
        "reserved_in_flight": q.in_flight, "waiting_work": q.waiting,
        # waiting_work stops at WAITING_CAP: waiting_more says there are more than it.
        "waiting_more": q.waiting_more,
        "waiting_text": BoundedCount(q.waiting, q.waiting_more).text(),
        # The longest-waiting held items (at most WAITERS_SHOWN; waiting_work counts all).
        "oldest_wait_us": next((w["waited_us"] for w in waiters.get(q.quota_key, ())), None),
        "waiting": waiters.get(q.quota_key, [])[:WAITERS_SHOWN],
    } for q in samples if q.quota_key.startswith(prefix)]
    return {"configured": bool(items), "items": items,
            "message": "" if items else NO_KEYS}
