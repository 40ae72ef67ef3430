"""Sign-in, sessions, roles and CSRF, over HTTP (no browser)."""

from __future__ import annotations

import re
import time

from admin_ui.sessions import COOKIE_NAME, SessionCodec, SessionData
from config.settings import Operator
from tests.admin.support import (
    PASSWORDS,
    SESSION_SECRET,
    ConsoleHarness,
    console_harness,
    console_settings,
    csrf_from,
    operators,
)
from tests.support.backends import FreshDatabase


async def _audit_count(console: ConsoleHarness) -> int:
    return len(await console.store.audit_list(limit=1000))


async def test_unauthenticated_api_is_401_json(console: ConsoleHarness) -> None:
    client = console.client()
    for path in ("/admin/api/overview", "/admin/api/work", "/admin/api/dlq",
                 "/admin/api/audit", "/admin/api/session"):
        response = await client.get(path)
        assert response.status_code == 401, path
        doc = await response.get_json()
        assert doc["error"] == "unauthenticated" and doc["message"]


async def test_unauthenticated_page_redirects_to_sign_in(console: ConsoleHarness) -> None:
    response = await console.client().get("/admin/work?state=dead")
    assert response.status_code == 302
    assert response.headers["Location"] == "/admin/sign-in?next=/admin/work%3Fstate%3Ddead"


async def test_unauthenticated_post_is_401_and_changes_nothing(console: ConsoleHarness) -> None:
    (dead,) = await console.dead_items(1)
    response = await console.client().post(f"/admin/api/work/{dead}/replay",
                                           json={"reason": "x"})
    assert response.status_code == 401
    assert await console.store.work_replays_of(dead) == []


async def test_sign_in_sets_a_hardened_session_cookie(console: ConsoleHarness) -> None:
    client = console.client()
    csrf = csrf_from(await (await client.get("/admin/sign-in")).get_data(as_text=True))
    response = await client.post("/admin/sign-in", form={
        "name": "otto", "password": PASSWORDS["otto"], "csrf_token": csrf, "next": "/admin/dlq"})
    assert response.status_code == 302
    assert response.headers["Location"] == "/admin/dlq"
    cookie = response.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE_NAME}=")
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/admin" in cookie
    max_age = re.search(r"Max-Age=(\d+)", cookie)
    assert max_age is not None
    assert 0 < int(max_age.group(1)) <= console.replica.settings.admin.session_ttl
    assert "Secure" not in cookie  # plain HTTP on loopback
    me = await (await client.get("/admin/api/session")).get_json()
    assert me["operator"] == "otto" and me["role"] == "operator"
    assert me["may"]["work.replay"] and not me["may"]["operators.read"]


async def test_cookie_is_secure_over_https(console: ConsoleHarness) -> None:
    client = console.client()
    page = await client.get("/admin/sign-in", scheme="https")
    assert "Secure" in page.headers["Set-Cookie"]
    csrf = csrf_from(await page.get_data(as_text=True))
    response = await client.post("/admin/sign-in", scheme="https", form={
        "name": "ada", "password": PASSWORDS["ada"], "csrf_token": csrf})
    assert response.status_code == 302
    assert "Secure" in response.headers["Set-Cookie"]


async def test_a_new_session_id_is_minted_at_sign_in(console: ConsoleHarness) -> None:
    client = console.client()
    before = csrf_from(await (await client.get("/admin/sign-in")).get_data(as_text=True))
    await client.post("/admin/sign-in", form={
        "name": "ada", "password": PASSWORDS["ada"], "csrf_token": before})
    after = (await (await client.get("/admin/api/session")).get_json())["csrf_token"]
    assert after != before


async def test_bad_credentials_get_one_generic_answer(console: ConsoleHarness) -> None:
    for name, password in (("otto", "wrong"), ("nobody", "whatever"), ("prox", ""),
                           ("prox", "anything"), ("otto", "x" * 5000)):
        client = console.client()
        csrf = csrf_from(await (await client.get("/admin/sign-in")).get_data(as_text=True))
        response = await client.post("/admin/sign-in", form={
            "name": name, "password": password, "csrf_token": csrf})
        body = await response.get_data(as_text=True)
        assert response.status_code == 401, name
        assert "invalid name or password" in body
        assert (await client.get("/admin/api/session")).status_code == 401


async def test_sign_in_form_needs_its_csrf_token(console: ConsoleHarness) -> None:
    client = console.client()
    await client.get("/admin/sign-in")
    response = await client.post("/admin/sign-in", form={
        "name": "ada", "password": PASSWORDS["ada"]})
    assert response.status_code == 403
    assert (await client.get("/admin/api/session")).status_code == 401


async def test_sign_in_never_redirects_off_site(console: ConsoleHarness) -> None:
    for target in ("//evil.example/x", "https://evil.example/", "/elsewhere", "/admin/api/x"):
        client = console.client()
        csrf = csrf_from(await (await client.get("/admin/sign-in")).get_data(as_text=True))
        response = await client.post("/admin/sign-in", form={
            "name": "ada", "password": PASSWORDS["ada"], "csrf_token": csrf, "next": target})
        assert response.headers["Location"] == "/admin/", target


async def test_viewer_is_refused_every_change(console: ConsoleHarness) -> None:
    (dead,) = await console.dead_items(1)
    (pending,) = await console.enqueue(1)
    client, csrf = await console.sign_in("viv")
    headers = {"X-CSRF-Token": csrf}
    for path, body in ((f"/admin/api/work/{dead}/replay", {"reason": "r"}),
                       (f"/admin/api/work/{pending}/cancel", {"reason": "r"}),
                       ("/admin/api/dlq/replay", {"family": "noop", "reason": "r"})):
        response = await client.post(path, json=body, headers=headers)
        assert response.status_code == 403, path
        assert (await response.get_json())["error"] == "forbidden"
    page = await client.post(f"/admin/work/{dead}/replay",
                             form={"reason": "r", "csrf_token": csrf})
    assert page.status_code == 403
    assert (await client.get("/admin/api/operators")).status_code == 403
    assert await console.store.work_replays_of(dead) == []
    item = await console.store.work_get(pending)
    assert item is not None and item.state.value == "pending"
    assert await _audit_count(console) == 0


async def test_posts_without_a_valid_csrf_token_change_nothing(console: ConsoleHarness) -> None:
    (dead,) = await console.dead_items(1)
    client, csrf = await console.sign_in("otto")
    _, other_csrf = await console.sign_in("ada")
    attempts = [
        {},  # no token at all
        {"X-CSRF-Token": "0" * 64},
        {"X-CSRF-Token": other_csrf},  # another session's token
        {"X-CSRF-Token": csrf, "Origin": "https://evil.example"},
    ]
    for headers in attempts:
        response = await client.post(f"/admin/api/work/{dead}/replay", json={"reason": "r"},
                                     headers=headers)
        assert response.status_code == 403, headers
        assert (await response.get_json())["error"] == "csrf_failed"
    form = await client.post(f"/admin/work/{dead}/replay", form={"reason": "r"})
    assert form.status_code == 403
    assert "CSRF" in await form.get_data(as_text=True)
    assert await console.store.work_replays_of(dead) == []
    assert await _audit_count(console) == 0
    ok = await client.post(f"/admin/api/work/{dead}/replay", json={"reason": "r"},
                           headers={"X-CSRF-Token": csrf, "Origin": "http://localhost"})
    assert ok.status_code == 200


async def test_sign_out_ends_the_session(console: ConsoleHarness) -> None:
    client, csrf = await console.sign_in("ada")
    refused = await client.post("/admin/sign-out")
    assert refused.status_code == 403  # sign-out is CSRF-protected too
    response = await client.post("/admin/sign-out", form={"csrf_token": csrf})
    assert response.status_code == 302
    assert response.headers["Location"] == "/admin/sign-in?notice=signed_out"
    assert f"{COOKIE_NAME}=;" in response.headers["Set-Cookie"]
    assert (await client.get("/admin/api/session")).status_code == 401


def _forged_cookie(data: SessionData, ttl: float = 3600.0) -> str:
    return SessionCodec(SESSION_SECRET.encode(), ttl).dumps(data)


async def test_expired_or_forged_sessions_are_refused(console: ConsoleHarness) -> None:
    codec = SessionCodec(SESSION_SECRET.encode(), console.replica.settings.admin.session_ttl)
    ada = console.replica.settings.operator("ada")
    assert ada is not None
    good = SessionData("sid-1", "ada", time.time(), codec.fingerprint(ada))
    old = SessionData("sid-2", "ada", time.time() - 9 * 3600, codec.fingerprint(ada))
    cases = {
        codec.dumps(good): 200,
        codec.dumps(old): 401,  # older than session_ttl (8 h)
        SessionCodec(b"another-secret-entirely!", 3600).dumps(good): 401,
        codec.dumps(good)[:-3] + "abc": 401,
        "garbage": 401,
    }
    for cookie, status in cases.items():
        client = console.client()
        response = await client.get("/admin/api/session",
                                    headers={"Cookie": f"{COOKIE_NAME}={cookie}"})
        assert response.status_code == status, cookie


async def test_changed_password_or_removed_operator_ends_sessions(
    sqlite_db: FreshDatabase,
) -> None:
    async with console_harness(sqlite_db) as first:
        client, _ = await first.sign_in("otto")
        jar = client.cookie_jar
        assert jar is not None
        value = next(c.value for c in jar if c.name == COOKIE_NAME)
        assert value
    changed = tuple(
        Operator(name=o.name, role=o.role, password_hash="$argon2id$v=19$m=8,t=1,p=1$x$y")
        if o.name == "otto" else o for o in operators()
    )
    removed = tuple(o for o in operators() if o.name != "otto")
    promoted = tuple(Operator(name=o.name, role="admin", password_hash=o.password_hash)
                     if o.name == "otto" else o for o in operators())
    for ops, status in ((changed, 401), (removed, 401), (promoted, 200)):
        settings = console_settings()
        settings = type(settings)(
            replica=settings.replica, admin=settings.admin, work=settings.work, operators=ops)
        async with console_harness(sqlite_db, settings=settings) as later:
            response = await later.client().get(
                "/admin/api/session", headers={"Cookie": f"{COOKIE_NAME}={value}"})
            assert response.status_code == status
            if status == 200:  # the role is read at request time
                assert (await response.get_json())["role"] == "admin"


async def test_proxy_mode(sqlite_db: FreshDatabase) -> None:
    settings = console_settings(auth="proxy", proxy_user_header="X-Remote-User")
    async with console_harness(sqlite_db, settings=settings) as console:
        (dead,) = await console.dead_items(1)
        client = console.client()
        missing = await client.get("/admin/api/overview")
        assert missing.status_code == 401
        stranger = await client.get("/admin/api/overview", headers={"X-Remote-User": "mallory"})
        assert stranger.status_code == 403
        assert (await stranger.get_json())["error"] == "forbidden"
        page = await client.get("/admin/", headers={"X-Remote-User": "mallory"})
        assert page.status_code == 403
        who = {"X-Remote-User": "prox"}
        me = await client.get("/admin/api/session", headers=who)
        assert me.status_code == 200
        doc = await me.get_json()
        assert doc["operator"] == "prox" and doc["auth"] == "proxy"
        no_csrf = await client.post(f"/admin/api/work/{dead}/replay", json={"reason": "r"},
                                    headers=who)
        assert no_csrf.status_code == 403
        ok = await client.post(f"/admin/api/work/{dead}/replay", json={"reason": "r"},
                               headers={**who, "X-CSRF-Token": doc["csrf_token"]})
        assert ok.status_code == 200
        # Another proxy user on the same cookie gets a fresh session and token.
        other = await client.get("/admin/api/session", headers={"X-Remote-User": "ada"})
        assert (await other.get_json())["csrf_token"] != doc["csrf_token"]
        sign_in = await client.get("/admin/sign-in")
        assert "handled by your proxy" in await sign_in.get_data(as_text=True)
