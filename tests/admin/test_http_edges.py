"""The admin listener's HTTP edges: early refusals on a kept-alive connection, bodies that
are not UTF-8 or nest too deeply, and a bug's answer. Real server on loopback where the
connection matters; the ASGI test client where only the answer does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio
from quart_trio import QuartTrio

from admin_ui.app import MAX_BODY_BYTES, create_app
from admin_ui.effects import effect_extensions
from admin_ui.sessions import COOKIE_NAME
from config.catalog import load_catalog
from daemon.services.http_server import serve_app
from tests.admin.support import PASSWORDS, ConsoleHarness, csrf_from
from tests.support.raw_http import refused_then_next

ULID = "01JAAAAAAAAAAAAAAAAAAAAAAA"  # a well-formed id that names nothing


@attrs.frozen
class Served:
    console: ConsoleHarness
    address: str

    async def sign_in(self, name: str) -> tuple[dict[str, str], str]:
        """A signed-in operator's ``Cookie`` header, and the session's CSRF token."""
        async with httpx.AsyncClient(base_url=self.address) as client:
            form = await client.get("/admin/sign-in")
            await client.post("/admin/sign-in", data={
                "name": name, "password": PASSWORDS[name], "next": "/admin/",
                "csrf_token": csrf_from(form.text)})
            session = await client.get("/admin/api/session")
            assert session.status_code == 200, session.text
            cookie = client.cookies[COOKIE_NAME]
        return {"Cookie": f"{COOKIE_NAME}={cookie}"}, str(session.json()["csrf_token"])


@pytest.fixture
async def served(console: ConsoleHarness) -> AsyncIterator[Served]:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_app, console.app, "127.0.0.1:0")
        yield Served(console, address)
        nursery.cancel_scope.cancel()


JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


async def _cases(served: Served, dead: str) -> list[tuple[str, str, dict[str, str], int, str]]:
    """(name, path, headers, status, error) for every kind of refusal made before the body
    is read."""
    ada, ada_csrf = await served.sign_in("ada")
    viv, viv_csrf = await served.sign_in("viv")
    replay = f"/admin/api/work/{dead}/replay"
    return [
        ("unauthenticated", replay, JSON, 401, "unauthenticated"),
        ("no_csrf_token", replay, {**JSON, **ada}, 403, "csrf_failed"),
        ("cross_origin", replay, {**JSON, **ada, "X-CSRF-Token": ada_csrf,
                                  "Origin": "http://evil.example"}, 403, "csrf_failed"),
        ("role", replay, {**JSON, **viv, "X-CSRF-Token": viv_csrf}, 403, "forbidden"),
        ("media_type", replay, {"Content-Type": "text/plain", **ada, "X-CSRF-Token": ada_csrf},
         415, "unsupported_media_type"),
        ("dlq_media_type", "/admin/api/dlq/replay",
         {"Content-Type": "text/plain", **ada, "X-CSRF-Token": ada_csrf},
         415, "unsupported_media_type"),
        ("page_unauthenticated", f"/admin/work/{dead}/replay", FORM, 302, ""),
    ]


@pytest.mark.parametrize("size", [60_000, 40])
async def test_the_next_request_after_an_early_refusal_is_answered(
    served: Served, size: int
) -> None:
    (dead,) = await served.console.dead_items(1)
    for name, path, headers, status, error in await _cases(served, dead):
        first, second = await refused_then_next(served.address, "POST", path, headers,
                                                b"x" * size, "/healthz")
        assert first.status == status, name
        if error:
            assert json.loads(first.body)["error"] == error, name
        # Within the body limit the late body is read and dropped: the connection is reused.
        assert second is not None and second.status == 200, name
    assert await served.console.store.work_replays_of(dead) == []


async def test_an_early_refusal_of_a_body_over_the_limit_closes_the_connection(
    served: Served
) -> None:
    (dead,) = await served.console.dead_items(1)
    first, second = await refused_then_next(served.address, "POST",
                                            f"/admin/api/work/{dead}/replay", JSON,
                                            b"x" * (MAX_BODY_BYTES + 1), "/healthz")
    assert first.status == 401 and first.headers.get("connection") == "close"
    assert second is None


# Every admin POST route, found in the app itself, so a new route is covered at once.

NOT_UTF8 = b'{"reason": "\xff\xfe caf\xe9"}'
TOO_DEEP = b"[" * 1000  # today: RecursionError -> 500 HTML
DEEP_VALID = b'{"reason": ' + b"[" * 1000 + b"]" * 1000 + b"}"


def _post_routes(app: QuartTrio) -> list[str]:
    paths = []
    for rule in app.url_map.iter_rules():
        if "POST" in (rule.methods or ()):
            path = rule.rule
            for arg in rule.arguments:
                path = path.replace(f"<{arg}>", ULID)
            paths.append(path)
    return sorted(paths, key=lambda p: p.endswith("/sign-out"))  # sign-out last


async def test_every_admin_post_route_answers_bad_bodies_with_a_clear_error(
    console: ConsoleHarness,
) -> None:
    app = create_app(console.replica, effect_extensions(load_catalog(console.replica.settings)))
    console.app = app
    routes = _post_routes(app)
    assert len(routes) >= 14, routes  # the kernel's, the effect journal's, sign-in/out
    client, csrf = await console.sign_in("ada")
    seen: dict[str, Any] = {}
    for path in routes:
        if path.startswith("/admin/api/"):
            for raw, word in ((NOT_UTF8, "UTF-8"), (TOO_DEEP, "deeper"),
                              (DEEP_VALID, "deeper")):
                r = await client.post(path, data=raw, headers={**JSON, "X-CSRF-Token": csrf})
                doc = await r.get_json()
                assert (r.status_code, r.content_type) == (400, "application/json"), path
                assert doc["error"] == "bad_request" and word in doc["message"], (path, doc)
                seen[path] = doc
        else:
            for raw, headers in ((NOT_UTF8, JSON), (TOO_DEEP, JSON),
                                 (b"reason=\xff\xfe&csrf_token=" + csrf.encode(), FORM),
                                 (b"reason=%ff%fe&csrf_token=" + csrf.encode(), FORM)):
                r = await client.post(path, data=raw, headers={**headers, "X-CSRF-Token": csrf})
                # Pages answer with a page (a banner, a redirect), never a server error.
                assert r.status_code < 500, (path, raw[:20], r.status_code)
                seen[path] = r.status_code
    assert set(seen) == set(routes)
    assert await console.store.audit_list(limit=10) == []


async def test_a_bug_is_a_json_500_without_a_traceback(console: ConsoleHarness) -> None:
    @console.app.get("/admin/api/boom")
    async def boom() -> str:
        raise RuntimeError("secret-ish internal detail")

    r = await console.client().get("/admin/api/boom")
    doc = await r.get_json()
    assert (r.status_code, doc["error"]) == (500, "internal_error")
    assert "secret-ish" not in json.dumps(doc) and "Traceback" not in json.dumps(doc)
