"""The console's retention figure: the pruner's last pass, from its lease row."""

from __future__ import annotations

from daemon.core.outcomes import Succeeded
from daemon.core.retention import DAY_US
from daemon.services.clock import WallClock
from tests.admin.support import ConsoleHarness
from tests.support.retention import prune
from tests.support.work import claim, enqueue, finalize


async def test_overview_shows_the_last_retention_pass(console: ConsoleHarness) -> None:
    client, _ = await console.sign_in("viv")
    before = await (await client.get("/admin/api/overview")).get_json()
    assert before["retention"] is None
    assert "No retention pass has run yet" in await (await client.get("/admin/")).get_data(
        as_text=True)
    now = WallClock().now_us()
    then = now - 40 * DAY_US
    await enqueue(console.store, 4, now=then)
    for item in (await claim(console.store, now=then)).claimed:
        await finalize(console.store, item, Succeeded(), now=then)
    await prune(console.store, now, holder="replica-7")
    doc = (await (await client.get("/admin/api/overview")).get_json())["retention"]
    assert doc["last_pass_by"] == "replica-7" and doc["result"] == "done"
    assert doc["holder"] is None  # released after the pass
    assert doc["tables"]["work_items"] == {"pruned": 4, "lag_s": 10 * 86_400}
    assert doc["tables"]["work_executions"]["pruned"] == 4
    html = await (await client.get("/admin/")).get_data(as_text=True)
    assert 'id="retention-tables"' in html and "replica-7" in html
    assert ('<tr data-table="work_items"><td><code>work_items</code></td>'
            '<td class="num pruned">4</td>') in html
