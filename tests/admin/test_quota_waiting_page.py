"""The Quota page's waiting work at size (issue 23): each key's count stops at its cap,
and each key with waiting work lists its own oldest held items. Read across keys, one
busy key's older items filled the page's read and a quieter key said "1 waiting" above
an empty list. A real replica's console on SQLite; items held through the real claim
and finalize statements."""

from __future__ import annotations

import pytest

import admin_ui.quota
from daemon.core.outcomes import Deferred
from daemon.core.quota import QuotaPolicy
from daemon.services.effect_quota import waiting_summary
from tests.admin.support import ConsoleHarness
from tests.support.work import claim, enqueue, finalize

SEC = 1_000_000
BUSY, QUIET = "hubspot:busy", "hubspot:quiet"


async def test_each_key_lists_its_own_held_items(console: ConsoleHarness,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    now = console.replica.clock.now_us()
    for key in (BUSY, QUIET):
        await console.store.quota_throttle(key, QuotaPolicy(limit=10, window_us=10 * SEC),
                                           now_us=now, retry_after_us=30 * SEC)
    ids = []
    for k in range(4):  # the busy key's three items are the oldest
        ids += await enqueue(console.store, 1, now=now - (100 - k) * SEC, family="held")
    items = {i.work_id: i for i in (await claim(console.store, now=now - 50 * SEC, limit=4,
                                                family="held")).claimed}
    for work_id, key in zip(ids, [BUSY, BUSY, BUSY, QUIET], strict=True):
        await finalize(console.store, items[work_id], Deferred(
            "quota_wait", now + 60 * SEC, waiting_summary(key, 1.0)), now=now - 50 * SEC)
    monkeypatch.setattr(admin_ui.quota, "WAITERS_READ", 2)
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/quota")).get_json()
    rows = {r["quota_key"]: r for r in doc["items"]}
    assert (rows[BUSY]["waiting_work"], rows[QUIET]["waiting_work"]) == (3, 1)
    assert [w["work_id"] for w in rows[BUSY]["waiting"]] == ids[:2]
    assert [w["work_id"] for w in rows[QUIET]["waiting"]] == [ids[3]]
    page = await (await client.get("/admin/quota")).get_data(as_text=True)
    assert ids[3] in page
    assert "The 2 longest waiting of 3." in page
