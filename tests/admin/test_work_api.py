"""The console's work, DLQ and audit API and pages: filters, replay, cancel, bulk."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from daemon.core.states import WorkState
from storage.port import ClaimParams
from tests.admin.support import ConsoleHarness, console_harness
from tests.support.backends import FreshDatabase


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        ("state=bogus", "unknown state 'bogus'"),
        ("limit=abc", "limit must be a whole number"),
        ("limit=0", "limit must be a whole number"),
        ("limit=201", "limit must be a whole number"),
        ("after=not-a-ulid", "after must be a work id"),
        ("colour=red", "unknown parameter 'colour'"),
        ("family=a&family=b", "given more than once"),
        ("org=" + "x" * 200, "org is longer than 128"),
        ("subject=a%00b", "control characters"),
    ],
)
async def test_malformed_work_filters_are_400(console: ConsoleHarness, query: str,
                                              fragment: str) -> None:
    client, _ = await console.sign_in("viv")
    api = await client.get(f"/admin/api/work?{query}")
    assert api.status_code == 400
    doc = await api.get_json()
    assert doc["error"] == "bad_filter" and fragment in doc["message"]
    page = await client.get(f"/admin/work?{query}")
    assert page.status_code == 400
    body = await page.get_data(as_text=True)
    assert 'id="error-banner"' in body and 'id="work-filters"' in body


@pytest.mark.parametrize("path", ["/admin/api/dlq?unreplayed=maybe", "/admin/api/dlq?limit=-1",
                                  "/admin/api/audit?limit=5000", "/admin/dlq?x=1",
                                  "/admin/audit?target=a&target=b"])
async def test_malformed_dlq_and_audit_filters_are_400(console: ConsoleHarness,
                                                       path: str) -> None:
    client, _ = await console.sign_in("viv")
    assert (await client.get(path)).status_code == 400


async def test_work_list_filters_and_pages(console: ConsoleHarness) -> None:
    a = await console.enqueue(3, org_id="org-a", source_lane="lane-1")
    b = await console.enqueue(2, org_id="org-b", subject_id="lead-9")
    client, _ = await console.sign_in("viv")

    async def ids(query: str) -> list[str]:
        doc = await (await client.get(f"/admin/api/work?{query}")).get_json()
        return [i["work_id"] for i in doc["items"]]

    assert set(await ids("org=org-a")) == set(a)
    assert set(await ids("subject=lead-9")) == set(b)
    assert set(await ids("lane=lane-1&state=pending")) == set(a)
    assert await ids("state=dead") == []
    first = await (await client.get("/admin/api/work?limit=2")).get_json()
    assert len(first["items"]) == 2 and first["next_after"]
    rest = await ids(f"after={first['next_after']}&limit=50")
    assert len(rest) == 3 and not set(rest) & {i["work_id"] for i in first["items"]}
    page = await client.get("/admin/work?org=org-a&limit=2")
    body = await page.get_data(as_text=True)
    assert page.status_code == 200 and 'id="next-page"' in body and "org=org-a" in body


async def test_replay_creates_lineage_and_audit(console: ConsoleHarness) -> None:
    (dead,) = await console.dead_items(1)
    client, csrf = await console.sign_in("otto")
    missing_reason = await client.post(f"/admin/api/work/{dead}/replay", json={},
                                       headers={"X-CSRF-Token": csrf})
    assert missing_reason.status_code == 400
    response = await client.post(f"/admin/api/work/{dead}/replay",
                                 json={"reason": "provider fixed"},
                                 headers={"X-CSRF-Token": csrf})
    assert response.status_code == 200
    new = (await response.get_json())["item"]
    assert new["replay_of"] == dead and new["state"] == "pending"
    detail = await (await client.get(f"/admin/api/work/{dead}")).get_json()
    assert [r["work_id"] for r in detail["lineage"]["replays"]] == [new["work_id"]]
    assert detail["can"]["replay"] is False
    (entry,) = detail["audit"]
    assert entry["action"] == "work.replay" and entry["actor"] == "otto"
    assert entry["reason"] == "provider fixed"
    # The audit entry records the pinned and the resolved current Catalog revision.
    assert entry["before"] == {"work_id": dead, "state": "dead", "catalog_revision": 0,
                               "catalog_digest": ""}
    assert entry["after"]["work_id"] == new["work_id"]
    assert entry["after"]["resolved_catalog_revision"] == 1
    assert entry["after"]["resolved_catalog_digest"].startswith("sha256:")
    child = await (await client.get(f"/admin/api/work/{new['work_id']}")).get_json()
    assert child["lineage"]["replay_of"]["work_id"] == dead
    assert child["lineage"]["created_by"][0]["audit_id"] == entry["audit_id"]
    keys = [s["key"] for s in child["sections"]]
    assert keys == ["receipts", "commands", "effect_attempts", "remote_links", "bindings"]
    again = await client.post(f"/admin/api/work/{dead}/replay", json={"reason": "again"},
                              headers={"X-CSRF-Token": csrf})
    assert again.status_code == 409
    assert (await again.get_json())["error"] == "conflict"


async def test_replay_refuses_live_or_unknown_work(console: ConsoleHarness) -> None:
    (pending,) = await console.enqueue(1)
    client, csrf = await console.sign_in("otto")
    headers = {"X-CSRF-Token": csrf}
    live = await client.post(f"/admin/api/work/{pending}/replay", json={"reason": "r"},
                             headers=headers)
    assert live.status_code == 409
    assert "only terminal work" in (await live.get_json())["message"]
    unknown = await client.post("/admin/api/work/01ARZ3NDEKTSV4RRFFQ69G5FAV/replay",
                                json={"reason": "r"}, headers=headers)
    assert unknown.status_code == 404
    malformed = await client.post("/admin/api/work/nope/replay", json={"reason": "r"},
                                  headers=headers)
    assert malformed.status_code == 404
    not_json = await client.post(f"/admin/api/work/{pending}/replay", data="reason=r",
                                 headers=headers)
    assert not_json.status_code == 415
    page = await client.post(f"/admin/work/{pending}/replay",
                             form={"reason": "r", "csrf_token": csrf})
    assert page.status_code == 409
    assert "only terminal work" in await page.get_data(as_text=True)


async def test_replay_of_a_family_this_build_does_not_run_fails_closed(
    sqlite_db: FreshDatabase,
) -> None:
    async with console_harness(sqlite_db, families=("noop", "gone")) as before:
        (dead,) = await before.dead_items(1, family="gone")
    async with console_harness(sqlite_db) as console:
        client, csrf = await console.sign_in("otto")
        response = await client.post(f"/admin/api/work/{dead}/replay", json={"reason": "r"},
                                     headers={"X-CSRF-Token": csrf})
        assert response.status_code == 409
        assert (await response.get_json())["error"] == "family_not_runnable"
        assert await console.store.work_replays_of(dead) == []


async def test_racing_replays_have_exactly_one_winner(database: FreshDatabase) -> None:
    async with console_harness(database) as console:
        (dead,) = await console.dead_items(1)
        racers = [await console.sign_in("otto"), await console.sign_in("ada")]
        statuses: list[int] = []
        bodies: list[dict[str, Any]] = []

        async def race(index: int) -> None:
            client, csrf = racers[index]
            response = await client.post(f"/admin/api/work/{dead}/replay",
                                         json={"reason": f"racer {index}"},
                                         headers={"X-CSRF-Token": csrf})
            statuses.append(response.status_code)
            bodies.append(await response.get_json())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(race, 0)
            nursery.start_soon(race, 1)
        assert sorted(statuses) == [200, 409]
        loser = bodies[statuses.index(409)]
        assert loser["error"] == "conflict" and "already replayed" in loser["message"]
        assert len(await console.store.work_replays_of(dead)) == 1
        assert len(await console.store.audit_list(target_id=dead)) == 1


async def test_cancel_is_audited(console: ConsoleHarness) -> None:
    pending, running = await console.enqueue(2)
    claimed = await console.store.work_claim(
        ClaimParams(family="noop", owner="w", limit=1, lease_ttl_us=30_000_000, window=4),
        console.replica.clock.now_us())
    (held,) = claimed.claimed
    pending = running if held.work_id == pending else pending
    client, csrf = await console.sign_in("otto")
    headers = {"X-CSRF-Token": csrf}
    first = await client.post(f"/admin/api/work/{pending}/cancel", json={"reason": "dup"},
                              headers=headers)
    assert await first.get_json() == {"work_id": pending, "disposition": "cancelled",
                                      "state": "cancelled"}
    second = await client.post(f"/admin/api/work/{held.work_id}/cancel",
                               json={"reason": "stop it"}, headers=headers)
    assert (await second.get_json())["disposition"] == "requested"
    terminal = await client.post(f"/admin/api/work/{pending}/cancel", json={"reason": "x"},
                                 headers=headers)
    assert terminal.status_code == 409
    entries = await console.store.audit_list()
    assert sorted((e.target_id, e.action, e.reason) for e in entries) == sorted([
        (pending, "work.cancel", "dup"), (held.work_id, "work.cancel", "stop it")])
    form = await client.post(f"/admin/work/{pending}/cancel",
                             form={"reason": "again", "csrf_token": csrf})
    assert form.status_code == 409


async def test_cancel_form_redirects_with_a_notice(console: ConsoleHarness) -> None:
    (pending,) = await console.enqueue(1)
    client, csrf = await console.sign_in("ada")
    response = await client.post(f"/admin/work/{pending}/cancel",
                                 form={"reason": "not needed", "csrf_token": csrf})
    assert response.status_code == 302
    assert response.headers["Location"] == f"/admin/work/{pending}?notice=cancelled"
    page = await client.get(response.headers["Location"])
    body = await page.get_data(as_text=True)
    assert 'id="notice-banner"' in body and "not needed" in body


async def test_dlq_lists_classes_and_marks_replayed_items(console: ConsoleHarness) -> None:
    boom = await console.dead_items(3, failure_class="boom")
    await console.dead_items(2, failure_class="bad_payload")
    client, csrf = await console.sign_in("otto")
    await client.post(f"/admin/api/work/{boom[0]}/replay", json={"reason": "r"},
                      headers={"X-CSRF-Token": csrf})
    doc = await (await client.get("/admin/api/dlq")).get_json()
    assert {(c["failure_class"], c["count"]) for c in doc["classes"]} == {
        ("boom", 3), ("bad_payload", 2)}
    by_id = {i["work_id"]: i for i in doc["items"]}
    assert len(by_id) == 5 and by_id[boom[0]]["replayed_as"]
    assert by_id[boom[1]]["operator_summary"] == "boom happened"
    waiting = await (await client.get(
        "/admin/api/dlq?failure_class=boom&unreplayed=1")).get_json()
    assert {i["work_id"] for i in waiting["items"]} == set(boom[1:])
    page = await client.get("/admin/dlq")
    assert page.status_code == 200 and 'id="bulk-form"' in await page.get_data(as_text=True)


async def test_bulk_replay_is_capped_authorized_and_audited(console: ConsoleHarness) -> None:
    boom = await console.dead_items(5, failure_class="boom")
    other = await console.dead_items(2, failure_class="other")
    client, csrf = await console.sign_in("otto")
    headers = {"X-CSRF-Token": csrf}
    missing = await client.post("/admin/api/dlq/replay", json={"reason": "r"}, headers=headers)
    assert missing.status_code == 400
    too_many = await client.post("/admin/api/dlq/replay", headers=headers,
                                 json={"family": "noop", "limit": 1000, "reason": "r"})
    assert too_many.status_code == 400
    first = await (await client.post("/admin/api/dlq/replay", headers=headers, json={
        "family": "noop", "failure_class": "boom", "limit": 3, "reason": "fixed"})).get_json()
    assert first["selected"] == 3 and first["replayed"] == 3 and first["complete"]
    second = await (await client.post("/admin/api/dlq/replay", headers=headers, json={
        "family": "noop", "failure_class": "boom", "limit": 3, "reason": "fixed"})).get_json()
    assert second["selected"] == 2 and second["replayed"] == 2
    done = {i["work_id"] for i in first["items"]} | {i["work_id"] for i in second["items"]}
    assert done == set(boom)
    for work_id in other:
        assert await console.store.work_replays_of(work_id) == []
    entries = await console.store.audit_list()
    singles = [e for e in entries if e.action == "work.replay"]
    bulks = [e for e in entries if e.action == "dlq.bulk_replay"]
    assert len(singles) == 5 and all(e.actor == "otto" for e in singles)
    assert all(f"[bulk {first['bulk_id']}]" in e.reason or f"[bulk {second['bulk_id']}]"
               in e.reason for e in singles)
    assert {json.loads(b.after)["bulk_id"] for b in bulks} == {second["bulk_id"],
                                                                first["bulk_id"]}
    assert entries[0].action == "dlq.bulk_replay"  # the summary follows its replays
    nothing = await (await client.post("/admin/api/dlq/replay", headers=headers, json={
        "family": "noop", "failure_class": "boom", "reason": "x"})).get_json()
    assert nothing["selected"] == 0 and nothing["audit_id"] is None
    assert len(await console.store.audit_list()) == len(entries)  # nothing to audit
    assert first["audit_id"] in {b.audit_id for b in bulks}
    unknown = await client.post("/admin/api/dlq/replay", headers=headers,
                                json={"family": "nosuch", "reason": "x"})
    assert unknown.status_code == 409
    assert (await unknown.get_json())["error"] == "family_not_runnable"
    assert len(await console.store.audit_list()) == len(entries)


async def test_concurrent_bulk_replays_report_conflicts_per_item(
    console: ConsoleHarness,
) -> None:
    dead = await console.dead_items(6)
    runs = [await console.sign_in("otto"), await console.sign_in("ada")]
    reports: list[dict[str, Any]] = []

    async def run(index: int) -> None:
        client, csrf = runs[index]
        response = await client.post("/admin/api/dlq/replay", headers={"X-CSRF-Token": csrf},
                                     json={"family": "noop", "reason": f"run {index}"})
        reports.append(await response.get_json())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, 0)
        nursery.start_soon(run, 1)
    replayed = [i for r in reports for i in r["items"] if i["outcome"] == "replayed"]
    conflicts = [i for r in reports for i in r["items"] if i["outcome"] == "conflict"]
    assert sorted(i["work_id"] for i in replayed) == sorted(dead)
    assert len(conflicts) == sum(r["selected"] for r in reports) - len(dead)
    assert all("already replayed" in c["message"] for c in conflicts)


async def test_bulk_form_renders_a_report(console: ConsoleHarness) -> None:
    await console.dead_items(2, failure_class="boom")
    client, csrf = await console.sign_in("ada")
    response = await client.post("/admin/dlq/replay", form={
        "family": "noop", "failure_class": "boom", "limit": "10", "reason": "retry all",
        "csrf_token": csrf})
    body = await response.get_data(as_text=True)
    assert response.status_code == 200
    assert '<span id="bulk-replayed">2</span>' in body
    bad = await client.post("/admin/dlq/replay", form={"family": "noop", "csrf_token": csrf})
    assert bad.status_code == 400 and "a reason is required" in await bad.get_data(as_text=True)


async def test_audit_page_and_api(console: ConsoleHarness) -> None:
    (dead,) = await console.dead_items(1)
    client, csrf = await console.sign_in("otto")
    await client.post(f"/admin/api/work/{dead}/replay", json={"reason": "because"},
                      headers={"X-CSRF-Token": csrf})
    doc = await (await client.get(f"/admin/api/audit?target={dead}")).get_json()
    (entry,) = doc["entries"]
    page = await client.get("/admin/audit")
    body = await page.get_data(as_text=True)
    assert entry["audit_id"] in body and "because" in body and entry["after"]["work_id"] in body


async def test_detail_page_shows_fields_lineage_and_actions_by_role(
    console: ConsoleHarness,
) -> None:
    (dead,) = await console.dead_items(1)
    viewer, _ = await console.sign_in("viv")
    body = await (await viewer.get(f"/admin/work/{dead}")).get_data(as_text=True)
    assert 'id="lineage-sections"' in body and "not applicable" in body
    assert "not recorded by this build yet" not in body and 'id="newer-build"' not in body
    assert 'id="replay-form"' not in body and 'id="actions-refused"' in body
    operator, _ = await console.sign_in("otto")
    body = await (await operator.get(f"/admin/work/{dead}")).get_data(as_text=True)
    assert 'id="replay-form"' in body and 'id="cancel-form"' not in body
    assert (await operator.get("/admin/work/01ARZ3NDEKTSV4RRFFQ69G5FAV")).status_code == 404


async def test_not_configured_features_say_so(console: ConsoleHarness) -> None:
    client, _ = await console.sign_in("viv")
    # (Subscriptions have their own page now: tests/admin/test_subscriptions_page.py.)
    # No quota key has been used: the page and the API say why.
    doc = await (await client.get("/admin/api/quota")).get_json()
    assert doc["configured"] is False and doc["items"] == []
    assert "No quota key is configured" in doc["message"]
    page = await client.get("/admin/quota")
    assert "No quota key is configured" in await page.get_data(
        as_text=True)
    # Bindings are live (from [[bindings]]); this console's settings have none.
    doc = await (await client.get("/admin/api/bindings")).get_json()
    assert doc["configured"] is False and doc["items"] == []
    page = await client.get("/admin/bindings")
    assert "No bindings are configured" in await page.get_data(as_text=True)


async def test_overview_reports_history_counters_and_replicas(console: ConsoleHarness) -> None:
    from daemon.services.replica import HistoryPoint
    from storage.port import OutcomeCount, QueueDepth

    now = console.replica.clock.now_us()
    console.replica.history.append(HistoryPoint(
        now - 5_000_000, 5.0, (QueueDepth("noop", WorkState.PENDING, 7, now - 65_000_000),),
        (OutcomeCount("noop", "succeeded", 10),)))
    console.replica.history.append(HistoryPoint(
        now, 5.0, (QueueDepth("noop", WorkState.PENDING, 3, now - 30_000_000),
                   QueueDepth("noop", WorkState.DEAD, 2, now - 90_000_000)),
        (OutcomeCount("noop", "succeeded", 20), OutcomeCount("noop", "retry", 4))))
    console.replica.metrics.claimed.labels("noop").inc(42)
    console.replica.metrics.lease_lost.labels("noop").inc(1)
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/overview")).get_json()
    assert doc["pressure"] == [
        {"family": "noop", "state": "dead", "depth": 2, "depth_capped": False,
         "oldest_age_s": 90.0},
        {"family": "noop", "state": "pending", "depth": 3, "depth_capped": False,
         "oldest_age_s": 30.0},
    ]
    assert doc["throughput"]["finished"] == 30 and doc["throughput"]["per_s"] == 3.0
    assert [p["depth"] for p in doc["series"]] == [{"pending": 7}, {"dead": 2, "pending": 3}]
    assert doc["local"]["claimed"] == {"noop": 42.0}
    assert doc["local"]["totals"]["lease_lost"] == 1.0
    assert doc["database"] == "ok" and doc["replicas"] == []
    page = await (await client.get("/admin/")).get_data(as_text=True)
    assert 'data-family="noop" data-state="pending"' in page and "this replica" in page


async def test_work_detail_shows_a_reclaimed_execution(console: ConsoleHarness) -> None:
    """Finding (issue 13): the journal showed one execution for an item on attempt 2."""
    (wid,) = await console.enqueue(1)
    now = console.replica.clock.now_us()

    def params(owner: str) -> ClaimParams:
        return ClaimParams(family="noop", owner=owner, limit=1, lease_ttl_us=1_000_000,
                           window=4, include_expired=True)

    await console.store.work_claim(params("crashed-replica"), now)
    (again,) = (await console.store.work_claim(params("rescuer"), now + 2_000_000)).claimed
    assert again.attempt == 2
    client, _ = await console.sign_in("viv")
    doc = await (await client.get(f"/admin/api/work/{wid}")).get_json()
    assert [(e["ownership_epoch"], e["outcome"], e["replica"], e["reclaimed_by"])
            for e in doc["executions"]] == [(1, "lease_lost", "crashed-replica", "rescuer")]
    page = await (await client.get(f"/admin/work/{wid}")).get_data(as_text=True)
    assert 'data-outcome="lease_lost"' in page and "<code>rescuer</code>" in page


async def test_work_for_a_newer_engine_says_why_it_waits(console: ConsoleHarness) -> None:
    (newer,) = await console.enqueue(1, engine_capability_version=99)
    (current,) = await console.enqueue(1)
    client, _ = await console.sign_in("viv")
    doc = await (await client.get(f"/admin/api/work/{newer}")).get_json()
    assert "engine capability v99" in doc["hold"] and "left for a replica" in doc["hold"]
    assert (await (await client.get(f"/admin/api/work/{current}")).get_json())["hold"] is None
    page = await (await client.get(f"/admin/work/{newer}")).get_data(as_text=True)
    assert 'id="capability-hold"' in page and "engine capability v99" in page


async def test_the_audit_page_shows_where_a_cli_action_came_from(
    console: ConsoleHarness,
) -> None:
    from storage.idgen import new_ulid
    from storage.port import AuditEntry

    now = console.replica.clock.now_us()
    await console.store.audit_append(AuditEntry(
        audit_id=new_ulid(now), at_us=now, actor="otto", role="operator", action="work.cancel",
        target_kind="work_item", target_id="x", reason="dup", before="{}", after="{}",
        origin='{"os_user":"root","sudo_user":"bob","uid":0,"via":"cli"}'))
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/audit")).get_json()
    assert doc["entries"][0]["origin"] == {"os_user": "root", "sudo_user": "bob", "uid": 0,
                                           "via": "cli"}
    page = await (await client.get("/admin/audit")).get_data(as_text=True)
    assert "via cli as root (sudo by bob)" in page


async def test_a_capped_depth_is_shown_as_at_least(console: ConsoleHarness) -> None:
    from daemon.services.replica import HistoryPoint
    from storage.port import QueueDepth

    now = console.replica.clock.now_us()
    console.replica.history.append(HistoryPoint(
        now, 5.0, (QueueDepth("noop", WorkState.DEAD, 100_000, now - 90_000_000, capped=True),
                   QueueDepth("noop", WorkState.PENDING, 3, now - 30_000_000)), ()))
    client, _ = await console.sign_in("viv")
    doc = await (await client.get("/admin/api/overview")).get_json()
    assert [(r["state"], r["depth"], r["depth_capped"]) for r in doc["pressure"]] == [
        ("dead", 100_000, True), ("pending", 3, False)]
    html = await (await client.get("/admin/overview/live")).get_data(as_text=True)
    assert '<a href="/admin/dlq">≥ 100000</a>' in html
    assert '<span class="value" id="open-depth">3</span>' in html
