"""The "find anything" lists and the search box over HTTP (admin_ui/find.py): filters,
pages, search, bad input (400 with a message, never a 500), and the viewer reads all."""

from __future__ import annotations

import json

import pytest

from admin_ui.app import create_app
from admin_ui.effects import effect_extensions
from config.catalog import load_catalog
from daemon.services.clock import WallClock
from tests.admin.support import ConsoleHarness
from tests.support.find import SECRETS, seed_calls

LISTS = ("attempts", "commands", "receipts", "ingress", "audit")


async def test_viewer_lists_throttled_attempts_page_by_page(console: ConsoleHarness) -> None:
    seeded = await seed_calls(console.store, WallClock().now_us() - 60_000_000)
    throttled = [s.attempt_id for s in reversed(seeded) if s.status == 429]
    client, _ = await console.sign_in("viv")
    first = await (await client.get("/admin/api/find/attempts?status=429&limit=2")).get_json()
    assert [i["attempt_id"] for i in first["items"]] == throttled[:2]
    assert {i["response_status"] for i in first["items"]} == {429}
    second = await (await client.get(
        f"/admin/api/find/attempts?status=429&limit=2&after={first['next_after']}")).get_json()
    assert [i["attempt_id"] for i in second["items"]] == throttled[2:]
    assert second["next_after"] is None
    recent = await (await client.get("/admin/api/find/attempts?since=1h&sort=oldest")
                    ).get_json()
    assert [i["attempt_id"] for i in recent["items"]] == [s.attempt_id for s in seeded]
    html = await (await client.get("/admin/find/attempts?status=429&limit=2")).get_data(
        as_text=True)
    assert throttled[0] in html and throttled[2] not in html
    assert f"after={throttled[1]}" in html
    index = await client.get("/admin/find")
    assert index.status_code == 200
    assert 'href="/admin/find/ingress"' in await index.get_data(as_text=True)
    for name in LISTS:
        response = await client.get(f"/admin/api/find/{name}")
        assert response.status_code == 200, name
        assert (await client.get(f"/admin/find/{name}")).status_code == 200, name


@pytest.mark.parametrize(("path", "message"), [
    ("/admin/api/find/attempts?status=abc", "status must be a whole number"),
    ("/admin/api/find/attempts?status=99", "status must be a whole number"),
    ("/admin/api/find/attempts?outcome=MAYBE", "outcome must be one of"),
    ("/admin/api/find/attempts?sort=sideways", "sort must be one of"),
    ("/admin/api/find/attempts?after=not-a-token", "after must be the page token"),
    ("/admin/api/find/attempts?since=yesterday", "since: a time is ISO 8601"),
    ("/admin/api/find/attempts?since=1h&until=2h", "since must be earlier than until"),
    ("/admin/api/find/attempts?limit=0", "limit must be a whole number"),
    ("/admin/api/find/attempts?color=red", "unknown parameter 'color'"),
    ("/admin/api/find/attempts?status=429&status=500", "given more than once"),
    ("/admin/api/find/commands?settlement=done", "settlement must be one of"),
    ("/admin/api/find/commands?generation=-1", "generation must be a whole number"),
    ("/admin/api/find/receipts?status=lost", "status must be one of"),
    ("/admin/api/find/ingress?state=eaten", "state must be one of"),
    ("/admin/api/find/audit?until=2026-13-01", "until: a time is ISO 8601"),
    ("/admin/api/search?q=", "q is required"),
    ("/admin/api/search?q=%01", "control characters"),
])
async def test_bad_input_is_a_400_with_a_message(console: ConsoleHarness, path: str,
                                                 message: str) -> None:
    client, _ = await console.sign_in("viv")
    response = await client.get(path)
    assert response.status_code == 400, await response.get_data(as_text=True)
    doc = await response.get_json()
    assert doc["error"] == "bad_filter" or doc["error"] == "bad_request", doc
    assert message in doc["message"]
    page = await client.get(path.replace("/admin/api/find/", "/admin/find/")
                            .replace("/admin/api/search", "/admin/find"))
    assert page.status_code == 400
    assert message.split("'")[0] in await page.get_data(as_text=True)


async def test_search_goes_straight_to_the_one_match_or_lists_them(
        console: ConsoleHarness) -> None:
    seeded = await seed_calls(console.store, WallClock().now_us() - 60_000_000)
    client, _ = await console.sign_in("viv")
    response = await client.get(f"/admin/find?q={seeded[0].attempt_id}")
    assert response.status_code == 302
    assert response.headers["Location"] == f"/admin/effects/attempts/{seeded[0].attempt_id}"
    doc = await (await client.get(f"/admin/api/search?q={seeded[0].command_id}")).get_json()
    # The command, and the work item that runs it (its subject).
    assert {(m["kind"], m["id"]) for m in doc["matches"]} == {
        ("command", seeded[0].command_id), ("work item", seeded[0].work_id)}
    listed = await client.get(f"/admin/find?q={seeded[0].command_id}")
    assert listed.status_code == 200
    html = await listed.get_data(as_text=True)
    assert f'href="/admin/work/{seeded[0].work_id}"' in html
    assert f'href="/admin/effects/commands/{seeded[0].command_id}"' in html
    nothing = await client.get("/admin/find?q=nothing-here")
    assert nothing.status_code == 200
    assert "Nothing has this id." in await nothing.get_data(as_text=True)


async def test_signed_out_is_refused(console: ConsoleHarness) -> None:
    response = await console.client().get("/admin/api/find/attempts")
    assert response.status_code == 401


async def test_a_failed_attempts_page_shows_the_exchange_without_secrets(
        console: ConsoleHarness) -> None:
    seeded = await seed_calls(console.store, WallClock().now_us() - 60_000_000)
    # The attempt page is the effect journal's (an extension of the console).
    console.app = create_app(console.replica,
                             effect_extensions(load_catalog(console.replica.settings)))
    client, _ = await console.sign_in("viv")
    failed = await client.get(f"/admin/effects/attempts/{seeded[1].attempt_id}")
    html = await failed.get_data(as_text=True)
    assert failed.status_code == 200
    assert 'id="request-excerpt"' in html and "jobtitle" in html
    assert "answered 429" in html and "x-ratelimit-remaining: 0" in html
    assert not any(secret in html for secret in SECRETS)
    ok = await (await client.get(f"/admin/effects/attempts/{seeded[0].attempt_id}")
                ).get_data(as_text=True)
    assert "A successful call keeps no bodies." in ok
    doc = await (await client.get(f"/admin/api/find/attempts/{seeded[1].attempt_id}")
                 ).get_json()
    assert doc["exchange"]["response_body"].startswith("{")
    assert not any(secret in json.dumps(doc) for secret in SECRETS)


async def test_work_list_shows_the_timeline_and_filters_by_creation_time(
        console: ConsoleHarness) -> None:
    (dead,) = await console.dead_items(1, failure_class="boom")
    (waiting,) = await console.enqueue(1)
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/work")).get_json()
    rows = {i["work_id"]: i for i in doc["items"]}
    assert rows[dead]["finished_at_us"] is not None
    assert rows[dead]["last_attempted_at_us"] == rows[dead]["finished_at_us"]
    assert rows[dead]["duration_s"] >= 0 and rows[dead]["age_s"] >= 0
    assert rows[dead]["last_error"] == "boom boom happened"
    assert (rows[waiting]["finished_at_us"], rows[waiting]["last_attempted_at_us"],
            rows[waiting]["duration_s"], rows[waiting]["last_error"]) == (None, None, None, None)
    recent = await (await client.get("/admin/api/work?since=1h")).get_json()
    assert {i["work_id"] for i in recent["items"]} == {dead, waiting}
    assert (await (await client.get("/admin/api/work?until=1h")).get_json())["items"] == []
    bad = await client.get("/admin/api/work?since=tomorrow")
    assert bad.status_code == 400
    assert "since: a time is ISO 8601" in (await bad.get_json())["message"]
    page = await (await client.get("/admin/work?since=1h&limit=1")).get_data(as_text=True)
    assert "boom boom happened" in page or "Last error" in page
    assert "since=20" in page  # the next page keeps the time filter
