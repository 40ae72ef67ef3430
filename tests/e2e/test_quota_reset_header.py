"""The provider's reset header moves the shared budget (issue 9 item 5; seed 9).

The shipped Outreach L1 names ``x-ratelimit-reset`` (seconds until the window resets) for
its per-user hour. Against the Outreach simulator's own rate window: a 2xx whose
``x-ratelimit-remaining`` is 0 blocks the key until that reset, for every replica (the
next command is scheduled for then, nothing is sent, no 429 is caused); a 429 without
``Retry-After`` blocks the key, and brings the work back, at the reset rather than at the
operation's default; a malformed, negative or absurd value is ignored with a counted
reason and never blocks (a 429 then falls back to the default).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.services.effect_quota import MAX_LEAD_US
from sandbox.hubspot_sim import Fault
from storage.port import WorkQuery
from storage.quota import QuotaKeyView
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.outreach_slice import running_outreach_slice

pytestmark = pytest.mark.slow

S = 1_000_000
DEFAULT_RETRY_AFTER_S = 10.0  # config/providers/outreach.toml's


async def _key(store: WorkStore) -> QuotaKeyView:
    (key,) = await store.quota_keys("outreach:per_user_hour:")
    return key


def _counter(metrics: str, name: str, label: str, value: str) -> float:
    prefix = f'{name}{{{label}="{value}"}} '
    (line,) = [x for x in metrics.splitlines() if x.startswith(prefix)]
    return float(line.removeprefix(prefix))


async def test_a_2xx_saying_none_remain_blocks_the_key_until_the_providers_reset(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path) as sl:
        sl.sim.set_rate(2, window_s=3600.0)  # Outreach's hour, two requests in it
        for n in range(3):
            await sl.lead(f"lead-{n}", 40 + n)
        for n in range(2):
            intent = await sl.set_title(f"lead-{n}", "CTO")
            await sl.wait_intent(f"lead-{n}", intent, "COMMITTED")
        second = sl.patches(41)[-1]
        assert second.status == 200
        key = await _key(store)
        # x-ratelimit-reset said about an hour (the window started at the first PATCH).
        reset = key.state.blocked_until_us - int(second.received_at * S)
        assert 3590 * S < reset <= 3601 * S, reset
        assert key.throttles_total == 0  # no 429 was involved
        # The third command is scheduled for the reset: nothing sent, no 429 caused.
        await sl.set_title("lead-2", "CTO")

        async def waiting() -> bool:
            items = await store.work_list(WorkQuery(family="external_effect"))
            pending = [i for i in items if i.state.value == "pending"]
            if len(items) != 3 or len(pending) != 1:
                return False
            executions = await store.work_executions(pending[0].work_id)
            return any(e.outcome == "deferred" and e.reason == "quota_wait"
                       for e in executions)

        await wait_for(waiting, within_s=30)
        (pending,) = [i for i in await store.work_list(WorkQuery(family="external_effect"))
                      if i.state.value == "pending"]
        # It comes back up to the slot lead before the reset (to be ready to send when the
        # ledger grants at the reset: effect_quota.MAX_LEAD_US), never earlier.
        assert pending.run_after_us >= key.state.blocked_until_us - S - MAX_LEAD_US
        assert sl.patches(42) == []
        assert all(r.status != 429 for r in sl.sim.requests)
        assert sl.replica is not None
        metrics = sl.replica.metrics_text().decode()
        assert _counter(metrics, "integrationd_quota_events_total", "event", "exhausted") == 1


async def test_a_429_without_retry_after_blocks_until_the_reset_header_says(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path) as sl:
        sl.sim.retry_after_on_429 = False  # only x-ratelimit-reset says when
        sl.sim.inject(Fault(mode="rate_limit", method="PATCH", path_prefix="/api/v2/",
                            retry_after_s=3))
        await sl.lead("lead-1", 41)
        intent = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent, "COMMITTED", within_s=30)
        first, second = sl.patches(41)
        assert (first.status, second.status) == (429, 200)
        key = await _key(store)
        assert key.throttles_total == 1
        blocked = key.state.blocked_until_us - int(first.received_at * S)
        assert 2 * S <= blocked <= 4 * S, blocked
        # Sent again once the reset had passed, well before the operation's default.
        gap = second.received_at - first.received_at
        assert 3.0 - 0.05 <= gap < DEFAULT_RETRY_AFTER_S, gap


@pytest.mark.parametrize(("text", "reason"), [
    ("soon", "malformed"),
    ("-5", "negative"),
    ("99999999", "beyond_cap"),  # about three years: no hour's window resets then
])
async def test_a_bad_reset_value_on_a_2xx_is_ignored_and_counted(
        database: FreshDatabase, store: WorkStore, tmp_path: Path, text: str,
        reason: str) -> None:
    async with running_outreach_slice(store, database.url, tmp_path) as sl:
        sl.sim.set_rate(1, window_s=3600.0)
        sl.sim.reset_text = text
        await sl.lead("lead-1", 41)
        intent = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent, "COMMITTED")
        (patch,) = sl.patches(41)
        assert patch.status == 200  # its x-ratelimit-remaining said 0
        key = await _key(store)
        assert key.state.blocked_until_us == 0  # never a block from a bad value
        assert sl.replica is not None
        metrics = sl.replica.metrics_text().decode()
        assert _counter(metrics, "integrationd_quota_reset_ignored_total", "reason",
                        reason) == 1
        assert _counter(metrics, "integrationd_quota_events_total", "event", "exhausted") == 0


async def test_a_429_with_a_bad_reset_and_no_retry_after_falls_back_to_the_default(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path) as sl:
        sl.sim.retry_after_on_429 = False
        sl.sim.reset_text = "Tue, 01 Dec 2026 20:00:00 GMT"
        sl.sim.inject(Fault(mode="rate_limit", method="PATCH", path_prefix="/api/v2/",
                            retry_after_s=3))
        await sl.lead("lead-1", 41)
        await sl.set_title("lead-1", "CTO")

        async def throttled() -> bool:
            return (await _key(store)).throttles_total == 1 if await store.quota_keys(
                "outreach:per_user_hour:") else False

        await wait_for(throttled, within_s=20)
        (first,) = sl.patches(41)
        assert first.status == 429
        blocked = (await _key(store)).state.blocked_until_us - int(first.received_at * S)
        assert (DEFAULT_RETRY_AFTER_S - 1) * S <= blocked <= (DEFAULT_RETRY_AFTER_S + 1) * S
        assert sl.replica is not None
        metrics = sl.replica.metrics_text().decode()
        assert _counter(metrics, "integrationd_quota_reset_ignored_total", "reason",
                        "malformed") == 1
