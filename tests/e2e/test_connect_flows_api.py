"""The Runtime's connect flows over real HTTP (``/v1/bindings/...``), on every backend.

Each flow is idempotent by the Runtime's key, audited with the Runtime as actor, and
moves the generation exactly when the flow table says; tokens are sealed at once and
never echoed. Every bad input is refused with a stable code and writes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from config.catalog import load_catalog
from config.settings import RuntimeClient, Secret
from daemon.api.app import ApiContext, create_api_app
from daemon.core.token_bundle import BundleContext, TokenKey, open_bundle
from daemon.services.catalog_view import CatalogView, publish_current
from daemon.services.clock import WallClock
from daemon.services.http_server import serve_app
from daemon.services.logs import LOGGER_NAME, JsonLineFormatter
from storage.grants import GrantState
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.slice import RUNTIME_TOKEN, SCOPE, slice_settings

KEY = TokenKey("k1", bytes(range(32)))
ACCESS = "access-SECRET-flow-1"
REFRESH = "refresh-SECRET-flow-1"
OTHER_TOKEN = "other-runtime-token"
IDENTITY = {"issuer": "https://auth.example", "remote_account_id": "portal-9",
            "remote_subject": "user-9", "scopes": ["contacts.read", "contacts.write"]}


def grant(access: Any = ACCESS, refresh: Any = REFRESH, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "oauth_code_exchange", "access_token": access,
                           "expires_in": 3600, "scopes": IDENTITY["scopes"]}
    if refresh is not None:
        doc["refresh_token"] = refresh
    doc.update(over)
    return doc


def connect_body(key: str = "k-connect", **over: Any) -> dict[str, Any]:
    doc = {"idempotency_key": key, "provider": "hubspot", "identity": IDENTITY,
           "grant": grant(), "reason": "the user connected HubSpot"}
    doc.update(over)
    return doc


@attrs.define
class Api:
    client: httpx.AsyncClient
    store: WorkStore
    ctx: ApiContext

    async def post(self, path: str, doc: Any, token: str = RUNTIME_TOKEN,
                   **kw: Any) -> httpx.Response:
        return await self.client.post(path, json=doc, headers={
            "Authorization": f"Bearer {token}"}, **kw)

    async def flow(self, binding: str, flow: str, doc: Any, **kw: Any) -> httpx.Response:
        return await self.post(f"/v1/bindings/{binding}/{flow}", doc, **kw)

    async def written(self) -> tuple[int, int, int, int]:
        """(bindings, grants, flow requests, audit entries): what a refusal must not move."""
        async def body(tx: SqlTx) -> tuple[int, int, int, int]:
            counts = []
            for table in ("principal_bindings", "authorization_grants",
                          "binding_flow_requests", "audit_log"):
                rows = await tx.fetchall(f"SELECT COUNT(*) FROM {table}")
                counts.append(int(rows[0][0]))
            return counts[0], counts[1], counts[2], counts[3]

        return await self.store.db.transact(body, name="test.count", write=False)


@pytest.fixture
async def api(database: FreshDatabase, store: WorkStore) -> AsyncIterator[Api]:
    settings = slice_settings(api_port=0, runtime_url="http://127.0.0.1:9",
                              hubspot_url="http://127.0.0.1:9", url=database.url)
    other = RuntimeClient(
        name="other", org_id="org-other", app_installation_id=SCOPE.app_installation_id,
        runtime_capability_id=SCOPE.runtime_capability_id,
        runtime_work_binding_digest=SCOPE.runtime_work_binding_digest,
        token=Secret(OTHER_TOKEN))
    settings = attrs.evolve(settings, runtimes=(*settings.runtimes, other),
                            api=attrs.evolve(settings.api, max_body_bytes=64 * 1024))
    catalog = load_catalog(settings)
    await publish_current(store, catalog, actor="test", role="admin", reason="flow tests",
                          now_us=WallClock().now_us())
    ctx = ApiContext(settings=settings, store=store, catalog=catalog, clock=WallClock(),
                     catalogs=CatalogView(store, catalog), token_key=KEY)
    app = create_api_app(ctx)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_app, app, "127.0.0.1:0")
        async with httpx.AsyncClient(base_url=address) as client:
            yield Api(client, store, ctx)
        nursery.cancel_scope.cancel()


async def _bundle(store: WorkStore, binding: str, generation: int) -> tuple[Any, Any]:
    stored = await store.grant_get(binding, generation)
    assert stored is not None
    opened = open_bundle(stored.sealed, {"k1": KEY},
                         BundleContext(binding, generation, stored.token_version))
    return stored, opened


async def test_connect_seals_the_grant_and_is_idempotent(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    first = await api.flow("user-9-hubspot", "connect", connect_body())
    assert first.status_code == 200, first.text
    doc = first.json()
    assert (doc["generation"], doc["state"], doc["token_version"], doc["replayed"]) == (
        1, "connected", 1, False)
    assert ACCESS not in first.text and REFRESH not in first.text
    stored, opened = await _bundle(api.store, "user-9-hubspot", 1)
    assert stored.state is GrantState.VALID and stored.sealed.key_id == "k1"
    assert (opened.access_token.reveal(), opened.refresh_token.reveal()) == (ACCESS, REFRESH)
    assert opened.scopes == ("contacts.read", "contacts.write")
    assert stored.expires_at_us > WallClock().now_us() + 3500 * 1_000_000
    # A retry after a lost response: the same answer, nothing applied twice.
    before = await api.written()
    again = await api.flow("user-9-hubspot", "connect", connect_body())
    assert again.status_code == 200 and again.json() == {**doc, "replayed": True}
    assert await api.written() == before
    (entry,) = [e for e in await api.store.audit_list(target_id="user-9-hubspot")]
    assert (entry.actor, entry.role, entry.action, entry.reason) == (
        "runtime:crm", "runtime", "binding.connect", "the user connected HubSpot")
    assert ACCESS not in entry.after and REFRESH not in entry.after
    facts = await api.store.binding_get("user-9-hubspot")
    assert facts is not None and (facts.org_id, facts.app_installation_id) == (
        SCOPE.org_id, SCOPE.app_installation_id)  # the caller's scope, never the body's
    read = await api.client.get("/v1/bindings/user-9-hubspot",
                                headers={"Authorization": f"Bearer {RUNTIME_TOKEN}"})
    assert read.json()["generation"] == 1 and read.json()["grant_state"] == "valid"
    # The flow was logged (binding_flow, once: the retry was answered), its tokens never.
    lines = [JsonLineFormatter().format(r) for r in caplog.records]
    (logged,) = [line for line in lines if '"event":"binding_flow"' in line]
    assert '"generation":1' in logged and '"token_version":1' in logged
    assert not [line for line in lines if ACCESS in line or REFRESH in line]


async def _connected(api: Api, binding: str = "b9") -> None:
    r = await api.flow(binding, "connect", connect_body(f"k-{binding}"))
    assert r.status_code == 200, r.text


# (flow, body fields, generation after, token version after, grant state after)
FLOW_ROWS: list[tuple[str, dict[str, Any], int, int, str]] = [
    ("reconnect", {"grant": grant("access-SECRET-2")}, 2, 1, "valid"),
    ("change_issuer", {"identity": {"issuer": "https://auth2.example"},
                       "grant": grant("access-SECRET-2")}, 2, 1, "valid"),
    ("change_issuer", {"identity": {"remote_subject": "user-10"},
                       "grant": grant("access-SECRET-2")}, 2, 1, "valid"),
    ("reinstall", {"identity": {"installation_id": "inst-2"},
                   "grant": grant("access-SECRET-2")}, 2, 1, "valid"),
    ("reinstall", {"grant": grant("access-SECRET-2")}, 2, 1, "valid"),
    ("rebind", {"identity": {"remote_account_id": "portal-10"},
                "grant": grant("access-SECRET-2")}, 2, 1, "valid"),
    ("change_scopes", {"identity": {"scopes": ["contacts.read", "contacts.write",
                                               "deals.write"]},
                       "grant": grant("access-SECRET-2")}, 2, 1, "valid"),
    # Narrowing keeps the generation: the narrower token is the next token version.
    ("change_scopes", {"identity": {"scopes": ["contacts.read"]},
                       "grant": grant("access-SECRET-2", scopes=["contacts.read"])}, 1, 2,
     "valid"),
    ("change_scopes", {"identity": {"scopes": ["contacts.read"]}}, 1, 1, "valid"),
    ("disconnect", {}, 1, 1, "revoked"),
]


@pytest.mark.parametrize(("flow", "fields", "generation", "version", "state"), FLOW_ROWS)
async def test_each_flow_moves_the_generation_as_the_table_says(
        api: Api, flow: str, fields: dict[str, Any], generation: int, version: int,
        state: str) -> None:
    await _connected(api)
    r = await api.flow("b9", flow, {"idempotency_key": f"k-{flow}", "expected_generation": 1,
                                    **fields})
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (doc["generation"], doc["token_version"]) == (generation, version)
    assert doc["generation_bumped"] == (generation == 2)
    assert "SECRET" not in r.text
    stored = await api.store.grant_get("b9", generation)
    assert stored is not None and (stored.token_version, stored.state.value) == (
        version, state)
    if fields.get("grant"):
        _, opened = await _bundle(api.store, "b9", generation)
        assert opened.access_token.reveal() == "access-SECRET-2"
    if generation == 2:  # the superseded generation's grant is revoked, never reused
        old = await api.store.grant_get("b9", 1)
        assert old is not None and (old.token_version, old.state) == (1, GrantState.REVOKED)
    actions = [e.action for e in await api.store.audit_list(target_id="b9")]
    assert actions[0] == f"binding.{flow}"  # audited, with the Runtime as actor


async def _refused(api: Api, response: httpx.Response, status: int, code: str,
                   before: tuple[int, int, int, int]) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"] == code
    assert response.json()["message"]
    assert "SECRET" not in response.text
    assert await api.written() == before


async def test_bad_input_is_refused_and_writes_nothing(api: Api) -> None:
    await _connected(api)
    before = await api.written()
    base = {"idempotency_key": "k-bad", "expected_generation": 1}
    cases: list[tuple[str, str, Any, int, str]] = [
        ("nobody", "disconnect", base, 404, "unknown_binding"),
        ("b9", "reconnect", {**base, "expected_generation": 7, "grant": grant()}, 409,
         "stale_generation"),
        ("b9", "disconnect", {**base, "expected_generation": "1"}, 400, "invalid_request"),
        ("b9", "disconnect", {"expected_generation": 1}, 400, "invalid_request"),
        ("b9", "disconnect", {**base, "surprise": 1}, 400, "invalid_request"),
        ("b9", "disconnect", [1, 2], 400, "invalid_request"),
        ("b9", "teleport", base, 404, "unknown_flow"),
        ("b9", "reconnect", {**base, "grant": grant(access=12345)}, 400,
         "invalid_token_field"),
        ("b9", "reconnect", {**base, "grant": grant(refresh={"t": "refresh-SECRET-x"})},
         400, "invalid_token_field"),
        ("b9", "reconnect", {**base, "grant": grant(expires_in=0)}, 400, "invalid_request"),
        ("b9", "reconnect", {**base, "grant": {**grant(), "id_token": "x"}}, 400,
         "invalid_request"),
        ("b9", "reconnect", base, 400, "grant_required"),
        ("b9", "rebind", {**base, "identity": {"issuer": "https://evil.example"},
                          "grant": grant()}, 400, "field_not_allowed"),
        ("b9", "disconnect", {**base, "grant": grant()}, 400, "grant_not_allowed"),
        ("b9", "connect", connect_body("k-again"), 409, "binding_exists"),
        ("b10", "connect", connect_body("k-b10", identity={"issuer": "x"}), 400,
         "invalid_request"),
        ("b10", "connect", connect_body("k-b10", kind="per_user"), 400, "invalid_request"),
    ]
    for binding, flow, doc, status, code in cases:
        r = await api.flow(binding, flow, doc)
        await _refused(api, r, status, code, before)
    # Not JSON, not a JSON content type, too large, no token, another scope's binding.
    headers = {"Authorization": f"Bearer {RUNTIME_TOKEN}", "Content-Type": "application/json"}
    r = await api.client.post("/v1/bindings/b9/disconnect", content=b"{nope",
                              headers=headers)
    await _refused(api, r, 400, "malformed_json", before)
    r = await api.client.post("/v1/bindings/b9/disconnect", content=b"{}",
                              headers={**headers, "Content-Type": "text/plain"})
    await _refused(api, r, 415, "unsupported_media_type", before)
    big = {**base, "reason": "x" * 400, "grant": grant(access="a" * 70_000)}
    r = await api.flow("b9", "reconnect", big)
    await _refused(api, r, 413, "payload_too_large", before)
    r = await api.client.post("/v1/bindings/b9/disconnect", json=base)
    await _refused(api, r, 401, "unauthenticated", before)
    r = await api.flow("b9", "disconnect", base, token=OTHER_TOKEN)
    await _refused(api, r, 404, "unknown_binding", before)
    r = await api.client.get("/v1/bindings/b9", headers={
        "Authorization": f"Bearer {OTHER_TOKEN}"})
    assert r.status_code == 404


async def test_a_key_reused_for_another_request_is_refused(api: Api) -> None:
    await _connected(api)
    first = await api.flow("b9", "disconnect", {"idempotency_key": "k-1",
                                                "expected_generation": 1})
    assert first.status_code == 200
    before = await api.written()
    r = await api.flow("b9", "reconnect", {"idempotency_key": "k-1", "expected_generation": 1,
                                           "grant": grant()})
    await _refused(api, r, 409, "idempotency_key_reused", before)
    # A stale CAS after the binding moved on: told so, with a stable reason.
    ok = await api.flow("b9", "reconnect", {"idempotency_key": "k-2",
                                            "expected_generation": 1, "grant": grant()})
    assert ok.status_code == 200 and ok.json()["generation"] == 2
    before = await api.written()
    stale = await api.flow("b9", "reconnect", {"idempotency_key": "k-3",
                                               "expected_generation": 1, "grant": grant()})
    await _refused(api, stale, 409, "stale_generation", before)


async def test_a_grant_without_a_token_key_is_refused(api: Api) -> None:
    api.ctx.token_key = None
    before = await api.written()
    r = await api.flow("b9", "connect", connect_body())
    await _refused(api, r, 409, "no_token_keys", before)


async def test_per_user_and_s2s_connects(api: Api) -> None:
    r = await api.flow("ada-hubspot", "connect", connect_body(
        "k-ada", kind="per_user", user_id="ada"))
    assert r.status_code == 200, r.text
    assert (r.json()["kind"], r.json()["user_id"]) == ("per_user", "ada")
    found = await api.store.binding_find_user(SCOPE.org_id, SCOPE.app_installation_id,
                                              "hubspot", "ada")
    assert [f.binding_id for f in found] == ["ada-hubspot"]
    s2s = await api.flow("outreach-app", "connect", connect_body(
        "k-s2s", provider="outreach", grant={"type": "s2s_installation"},
        identity={**IDENTITY, "installation_id": "install-77"}))
    assert s2s.status_code == 200, s2s.text
    stored, opened = await _bundle(api.store, "outreach-app", 1)
    assert stored.expires_at_us == 0 and opened.access_token.reveal() == ""  # minted later
