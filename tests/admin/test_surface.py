"""The listener's other routes keep their shapes; secrets never leave the server."""

from __future__ import annotations

import json

from storage.port import ClaimParams
from tests.admin.support import SESSION_SECRET, ConsoleHarness, operators


async def test_metrics_health_and_readiness_are_unchanged(console: ConsoleHarness) -> None:
    client = console.client()
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "integrationd_replica_draining" in await metrics.get_data(as_text=True)
    health = await client.get("/healthz")
    assert (health.status_code, await health.get_json()) == (200, {"status": "ok"})
    ready = await client.get("/readyz")
    assert ready.status_code == 503  # this replica was never started
    doc = await ready.get_json()
    assert doc == {"ready": False, "state": "starting", "database": "unreachable",
                   "replica": "console-test"}
    assert "Set-Cookie" not in health.headers and "Server-Timing" in health.headers


async def test_http_errors_are_json(console: ConsoleHarness) -> None:
    client, csrf = await console.sign_in("ada")
    assert await (await client.get("/nope")).get_json() == {
        "error": "not_found", "message": "no such route"}
    wrong = await client.put("/admin/api/work")
    assert (wrong.status_code, (await wrong.get_json())["error"]) == (405,
                                                                      "method_not_allowed")
    big = await client.post("/admin/api/dlq/replay", data="x" * (70 * 1024),
                            headers={"X-CSRF-Token": csrf, "Content-Type": "application/json"})
    assert big.status_code == 413
    bad = await client.post("/admin/api/dlq/replay", data="{not json",
                            headers={"X-CSRF-Token": csrf, "Content-Type": "application/json"})
    assert (bad.status_code, (await bad.get_json())["error"]) == (400, "bad_request")


async def test_console_pages_carry_security_headers(console: ConsoleHarness) -> None:
    client, _ = await console.sign_in("viv")
    page = await client.get("/admin/")
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert page.headers["Cache-Control"] == "no-store"
    assert page.headers["X-Frame-Options"] == "DENY"
    static = await client.get("/admin/static/console.js")
    assert static.status_code == 200


async def test_no_secret_payload_or_token_in_any_response(console: ConsoleHarness) -> None:
    marker = "PAYLOAD-MARKER-7f3a"
    (done,) = await console.dead_items(1, payload=json.dumps({"secret": marker}))
    await console.enqueue(1, payload=json.dumps({"secret": marker}))
    now = console.replica.clock.now_us()
    claimed = await console.store.work_claim(
        ClaimParams(family="noop", owner="w", limit=1, lease_ttl_us=30_000_000, window=4), now)
    (held,) = claimed.claimed
    assert held.lease_token
    client, csrf = await console.sign_in("ada")
    replay = await client.post(f"/admin/api/work/{done}/replay", json={"reason": "r"},
                               headers={"X-CSRF-Token": csrf})
    new_id = (await replay.get_json())["item"]["work_id"]
    forbidden = [marker, SESSION_SECRET, held.lease_token,
                 *(o.password_hash for o in operators() if o.password_hash)]
    paths = ["/admin/", "/admin/work", f"/admin/work/{done}", f"/admin/work/{held.work_id}",
             f"/admin/work/{new_id}", "/admin/dlq", "/admin/audit", "/admin/operators",
             "/admin/api/overview", "/admin/api/work", f"/admin/api/work/{done}",
             f"/admin/api/work/{held.work_id}", "/admin/api/dlq", "/admin/api/audit",
             "/admin/api/operators", "/admin/api/session", "/admin/api/replicas",
             "/admin/api/openapi.json", "/metrics", "/readyz"]
    for path in paths:
        response = await client.get(path)
        assert response.status_code in (200, 503), path
        text = await response.get_data(as_text=True)
        headers = str(response.headers)
        for secret in forbidden:
            assert secret not in text, (path, secret[:12])
            assert secret not in headers, (path, secret[:12])
    detail = await (await client.get(f"/admin/api/work/{held.work_id}")).get_json()
    assert "payload" not in detail["item"] and "lease_token" not in detail["item"]
    assert detail["item"]["payload_bytes"] > 0
