"""Small helpers for kernel tests."""

from __future__ import annotations

from typing import Any

import attrs

from daemon.core.outcomes import Finalization, Outcome, decide
from daemon.core.retry import BackoffPolicy
from daemon.core.work import WorkItem, WorkSpec
from storage.port import ClaimParams, ClaimResult, FinalizeResult
from storage.work_store import WorkStore

T0 = 1_800_000_000_000_000  # a fixed "now" (UTC epoch microseconds)
SEC = 1_000_000
TTL = 30 * SEC
POLICY = BackoffPolicy(base_s=1.0, cap_s=60.0)


@attrs.define
class FixedClock:
    """A handler's clock that reads ``now`` (a WorkContext's ``clock``)."""

    now: int

    def now_us(self) -> int:
        return self.now


def spec(**kw: Any) -> WorkSpec:
    base: dict[str, Any] = {
        "family": "noop",
        "org_id": "org-1",
        "subject_kind": "lead",
        "subject_id": "lead-1",
    }
    base.update(kw)
    return WorkSpec(**base)


async def enqueue(store: WorkStore, n: int = 1, now: int = T0, **kw: Any) -> list[str]:
    results = await store.work_enqueue([spec(**kw) for _ in range(n)], now)
    return [r.work_id for r in results]


async def claim(store: WorkStore, owner: str = "A", now: int = T0, limit: int = 10,
                ttl: int = TTL, family: str = "noop", expired: bool = True) -> ClaimResult:
    return await store.work_claim(
        ClaimParams(family=family, owner=owner, limit=limit, lease_ttl_us=ttl,
                    window=limit * 4, include_expired=expired),
        now,
    )


def finalization(item: WorkItem, outcome: Outcome, now: int = T0) -> Finalization:
    assert item.fence is not None
    return decide(outcome, fence=item.fence, attempt=item.attempt,
                  max_attempts=item.max_attempts, policy=POLICY, jitter_sample=0.5, now_us=now,
                  family=item.family)


async def finalize(store: WorkStore, item: WorkItem, outcome: Outcome,
                   now: int = T0, replica: str = "A") -> FinalizeResult:
    (result,) = await store.work_finalize_if_owner([finalization(item, outcome, now)],
                                                    replica, lambda: now)
    return result
