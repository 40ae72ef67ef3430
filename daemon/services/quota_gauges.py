"""Provider quota as operators see it: one sample per quota key (seed 9; issue 9 item 6).

Theory of operation
-------------------
The keys are the ones the Catalog's L1 dimensions and L2 bindings can count against
(:func:`daemon.services.effect_quota.declared_keys`), so a configured quota shows before
its first dispatch. For each, the shared row (``quota_keys``) says what it granted and
when it was last throttled, the reservations table what is in flight, and the work queue
how many items wait for a slot (``quota_wait``); the pure core says how many slots a
grant could start now (its *budget*). The replica's depth loop samples these into
gauges; the console shows the same rows. The waiting count per key is an index range
(migration 0045), stopped at ``storage.quota.WAITING_CAP``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from daemon.core.quota import QuotaState, available
from daemon.services.effect_quota import QuotaKey
from storage.work_store import WorkStore


@attrs.frozen(kw_only=True)
class QuotaSample:
    quota_key: str
    limit: int
    window_us: int
    kind: str
    burst: int
    budget: int  # slots a grant could start now
    in_flight: int  # reservations bound to a claim, not yet sent
    waiting: int  # work rescheduled until the key has a slot (at most WAITING_CAP)
    waiting_more: bool  # more than ``waiting`` (the count stopped at WAITING_CAP)
    tat_us: int
    blocked_until_us: int
    last_throttled_at_us: int
    granted_total: int
    returned_total: int
    throttles_total: int
    declared: bool  # by this replica's Catalog (else only seen in the shared table)


async def sample_quota(store: WorkStore, declared: Mapping[str, QuotaKey],
                       now_us: int) -> list[QuotaSample]:
    rows = {v.quota_key: v for v in await store.quota_keys()}
    in_flight = await store.quota_reservations_in_flight()
    names = sorted(set(declared) | set(rows))
    waiting = await store.quota_waiting_counts(names)
    out = []
    for name in names:
        row, key = rows.get(name), declared.get(name)
        state = row.state if row is not None else QuotaState()
        policy = key.policy if key is not None else None
        out.append(QuotaSample(
            quota_key=name,
            limit=policy.limit if policy else row.limit_count if row else 0,
            window_us=policy.window_us if policy else row.window_us if row else 0,
            kind=policy.kind.value if policy else "",
            burst=policy.burst if policy else 0,
            # A key this Catalog does not declare has no policy here: no budget is claimed.
            budget=available(policy, state, now_us=now_us) if policy else 0,
            in_flight=in_flight.get(name, 0), waiting=waiting[name].n,
            waiting_more=waiting[name].more,
            tat_us=state.tat_us, blocked_until_us=state.blocked_until_us,
            last_throttled_at_us=row.last_throttled_at_us if row else 0,
            granted_total=row.granted_total if row else 0,
            returned_total=row.returned_total if row else 0,
            throttles_total=row.throttles_total if row else 0,
            declared=key is not None,
        ))
    return out
