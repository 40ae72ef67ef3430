"""The /v1 service API over real HTTP: authentication, validation, the handoff fence.

Every refusal is a 4xx with a JSON error body, and writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx
import pytest
import trio

from config.catalog import load_catalog
from config.settings import RuntimeClient, Secret
from daemon.api.app import ApiContext, create_api_app
from daemon.core.canonical import canonical_digest
from daemon.core.handoff import EffectHandoffKey, TrustedRuntimeWorkScope
from daemon.core.principals import BindingEvent
from daemon.services.catalog_view import CatalogView, publish_current
from daemon.services.clock import WallClock
from daemon.services.http_server import serve_app
from storage.port import WorkQuery
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.commands import command_doc
from tests.support.raw_http import refused_then_next
from tests.support.slice import RUNTIME_TOKEN, SCOPE, slice_settings

OTHER_ORG = attrs.evolve(SCOPE, org_id="org-other")
OTHER_INSTALL = attrs.evolve(SCOPE, app_installation_id="install-other")
OTHER_TOKEN = "other-runtime-token"


def body(intent_id: str = "int-1", *, scope: TrustedRuntimeWorkScope = SCOPE,
         title: str = "CTO", outbox: str = "ob-1", command_intent: str | None = None,
         **over: Any) -> dict[str, Any]:
    command = command_doc(command_intent or intent_id, title)
    command.update(over)
    return {
        "effect_handoff_key": EffectHandoffKey(scope, intent_id).encode(),
        "payload_digest": canonical_digest(command),
        "runtime_outbox_id": outbox,
        "command": command,
    }


@attrs.define
class Api:
    client: httpx.AsyncClient
    store: WorkStore
    address: str

    async def post(self, path: str, doc: Any, token: str | None = RUNTIME_TOKEN,
                   **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return await self.client.post(path, json=doc, headers=headers, **kw)

    async def nothing_written(self) -> bool:
        return await self.store.work_list(WorkQuery(family="external_effect")) == []


@pytest.fixture
async def api(database: FreshDatabase, store: WorkStore) -> AsyncIterator[Api]:
    settings = slice_settings(api_port=0, runtime_url="http://127.0.0.1:9",
                              hubspot_url="http://127.0.0.1:9", url=database.url)
    other = RuntimeClient(
        name="other", org_id=OTHER_ORG.org_id, app_installation_id=SCOPE.app_installation_id,
        runtime_capability_id=SCOPE.runtime_capability_id,
        runtime_work_binding_digest=SCOPE.runtime_work_binding_digest,
        token=Secret(OTHER_TOKEN))
    settings = attrs.evolve(settings, runtimes=(*settings.runtimes, other))
    catalog = load_catalog(settings)
    await publish_current(store, catalog, actor="test", role="admin", reason="api tests",
                          now_us=WallClock().now_us())
    app = create_api_app(ApiContext(settings=settings, store=store, catalog=catalog,
                                    clock=WallClock(), catalogs=CatalogView(store, catalog)))
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_app, app, "127.0.0.1:0")
        async with httpx.AsyncClient(base_url=address) as client:
            yield Api(client, store, address)
        nursery.cancel_scope.cancel()


async def test_accept_is_idempotent(api: Api) -> None:
    first = await api.post("/v1/commands", body())
    assert first.status_code == 200, first.text
    assert first.json()["admission"] == "COMMAND_ACCEPTED"
    again = await api.post("/v1/commands", body())
    assert again.status_code == 200 and again.json() == first.json()
    read = await api.client.get("/v1/handoffs",
                                params={"effect_handoff_key": body()["effect_handoff_key"]},
                                headers={"Authorization": f"Bearer {RUNTIME_TOKEN}"})
    assert read.status_code == 200 and read.json()["command_id"] == first.json()["command_id"]
    assert len(await api.store.work_list(WorkQuery(family="external_effect"))) == 1


async def test_commands_pin_the_durable_binding_generation(api: Api) -> None:
    """Admission pins the PrincipalBinding's generation (bootstrapped from the TOML on
    first use), refuses a disconnected binding writing nothing, and after a reconnect pins
    the new generation."""
    first = await api.post("/v1/commands", body("int-1"))
    assert first.status_code == 200, first.text
    command = await api.store.command_get(first.json()["command_id"])
    assert command is not None and command.binding_generation == 1
    facts = await api.store.binding_get(command.binding_id)
    assert facts is not None and facts.generation == 1
    who = Actor(name="ada", role="admin", reason="reinstall")
    now = WallClock().now_us()
    await api.store.binding_transition(command.binding_id, BindingEvent.DISCONNECT, who,
                                       expected_generation=1, now_us=now)
    refused = await api.post("/v1/commands", body("int-2"))
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "binding_not_connected"
    assert command.binding_id in refused.json()["message"]
    batch = await api.post("/v1/commands/batch", {"commands": [body("int-2")]})
    assert batch.json()["results"][0]["error"] == "binding_not_connected"
    assert await api.store.admission_read(body("int-2")["effect_handoff_key"]) is None
    assert len(await api.store.work_list(WorkQuery(family="external_effect"))) == 1
    await api.store.binding_transition(command.binding_id, BindingEvent.RECONNECT, who,
                                       expected_generation=1, now_us=now)
    second = await api.post("/v1/commands", body("int-2"))
    assert second.status_code == 200, second.text
    pinned = await api.store.command_get(second.json()["command_id"])
    assert pinned is not None and pinned.binding_generation == 2


@pytest.mark.parametrize(
    ("token", "status", "error"),
    [(None, 401, "unauthenticated"), ("wrong", 401, "unauthenticated")],
)
async def test_unauthenticated(api: Api, token: str | None, status: int, error: str) -> None:
    r = await api.post("/v1/commands", body(), token=token)
    assert (r.status_code, r.json()["error"]) == (status, error)
    assert await api.nothing_written()


@pytest.mark.parametrize(
    ("doc", "status", "error"),
    [
        ([], 400, "invalid_request"),
        ({"effect_handoff_key": "nope"}, 400, "bad_handoff_key"),
        ({**body(), "payload_digest": "sha256:" + "0" * 64}, 400, "payload_digest_mismatch"),
        ({**body(), "payload_digest": "md5:x"}, 400, "invalid_request"),
        ({**body(), "runtime_outbox_id": ""}, 400, "invalid_request"),
        (body(operation="salesforce.nope"), 422, "unknown_operation"),
        (body(catalog_revision=6), 409, "catalog_revision_not_published"),
        (body(intent_kind="DELETE"), 422, "invalid_request"),
        (body(request={"properties": {"jobtitle": "x", "email": "y"}}), 422, "invalid_request"),
        (body(request={"properties": {}}), 422, "invalid_request"),
        (body(logical_target={"object": "account", "account_id": "a"}), 422, "invalid_request"),
        (body("int-1", command_intent="int-other"), 400, "invalid_request"),
    ],
)
async def test_malformed_commands_are_refused(api: Api, doc: Any, status: int,
                                              error: str) -> None:
    r = await api.post("/v1/commands", doc)
    assert (r.status_code, r.json()["error"]) == (status, error), r.text
    assert r.json()["message"]
    assert await api.nothing_written()


async def test_transport_level_refusals(api: Api) -> None:
    auth = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}
    r = await api.client.post("/v1/commands", content=b"{not json", headers={
        **auth, "Content-Type": "application/json"})
    assert (r.status_code, r.json()["error"]) == (400, "malformed_json")
    r = await api.client.post("/v1/commands", content=b"x=1", headers={
        **auth, "Content-Type": "application/x-www-form-urlencoded"})
    assert (r.status_code, r.json()["error"]) == (415, "unsupported_media_type")
    r = await api.client.get("/v1/nothing-here", headers=auth)
    assert (r.status_code, r.json()["error"]) == (404, "not_found")
    r = await api.client.get("/v1/commands", headers=auth)
    assert (r.status_code, r.json()["error"]) == (405, "method_not_allowed")
    # Last: the server closes the connection instead of reading the rest of the body.
    big = body(title="x" * 300_000)  # over api.max_body_bytes (256 KiB)
    r = await api.post("/v1/commands", big)
    assert (r.status_code, r.json()["error"]) == (413, "payload_too_large")
    assert await api.nothing_written()


@pytest.mark.parametrize("scope", [OTHER_ORG, OTHER_INSTALL,
                                   attrs.evolve(SCOPE, runtime_capability_id="cap.other"),
                                   attrs.evolve(SCOPE, runtime_work_binding_digest="sha256:x")])
async def test_cross_scope_requests_fail_closed_without_disclosure(
    api: Api, scope: TrustedRuntimeWorkScope
) -> None:
    accepted = await api.post("/v1/commands", body())  # the real owner's admission
    assert accepted.status_code == 200
    foreign = body(scope=scope)
    for path, doc in (("/v1/commands", foreign),
                      ("/v1/handoffs/reject", {k: foreign[k] for k in (
                          "effect_handoff_key", "payload_digest", "runtime_outbox_id")})):
        r = await api.post(path, doc)
        assert (r.status_code, r.json()["error"]) == (403, "scope_mismatch")
        assert accepted.json()["command_id"] not in r.text
    # Another org's caller presenting the owner's own key is refused the same way.
    r = await api.post("/v1/commands", body(), token=OTHER_TOKEN)
    assert (r.status_code, r.json()["error"]) == (403, "scope_mismatch")
    read = await api.client.get("/v1/handoffs",
                                params={"effect_handoff_key": body()["effect_handoff_key"]},
                                headers={"Authorization": f"Bearer {OTHER_TOKEN}"})
    assert read.status_code == 403 and accepted.json()["command_id"] not in read.text
    assert len(await api.store.work_list(WorkQuery(family="external_effect"))) == 1


async def test_repeated_key_with_another_digest_or_outbox_is_quarantined(api: Api) -> None:
    assert (await api.post("/v1/commands", body())).status_code == 200
    for doc in (body(title="CEO"), body(outbox="ob-2")):
        r = await api.post("/v1/commands", doc)
        assert (r.status_code, r.json()["error"]) == (409, "quarantined")
        assert "command_id" not in r.json()
    assert await api.store.quarantine_count(body()["effect_handoff_key"]) == 2
    assert len(await api.store.work_list(WorkQuery(family="external_effect"))) == 1


async def test_late_delivery_after_rejection_creates_nothing(api: Api) -> None:
    doc = body()
    handoff = {k: doc[k] for k in ("effect_handoff_key", "payload_digest", "runtime_outbox_id")}
    auth = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}
    unknown = await api.client.get("/v1/handoffs", headers=auth,
                                   params={"effect_handoff_key": doc["effect_handoff_key"]})
    assert unknown.status_code == 404 and unknown.json()["admission"] == "UNKNOWN"
    tomb = await api.post("/v1/handoffs/reject", handoff)
    assert tomb.status_code == 200 and tomb.json()["admission"] == "HANDOFF_REJECTED"
    assert tomb.json()["receipt"]["receipt_version"] == 1
    again = await api.post("/v1/handoffs/reject", handoff)
    assert again.json() == tomb.json()  # idempotent after a lost response
    late = await api.post("/v1/commands", doc)
    assert late.status_code == 409 and late.json()["admission"] == "HANDOFF_REJECTED"
    assert await api.nothing_written()


async def test_accept_racing_reject_over_http(api: Api) -> None:
    for trial in range(8):
        doc = body(f"int-race-{trial}")
        handoff = {k: doc[k] for k in ("effect_handoff_key", "payload_digest",
                                       "runtime_outbox_id")}
        answers: list[str] = []

        async def accept() -> None:
            answers.append((await api.post("/v1/commands", doc)).json()["admission"])  # noqa: B023

        async def reject() -> None:
            answers.append((await api.post("/v1/handoffs/reject", handoff)  # noqa: B023
                            ).json()["admission"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            nursery.start_soon(reject)
        assert len(set(answers)) == 1, answers


async def test_openapi_document_lists_every_route(api: Api) -> None:
    r = await api.client.get("/v1/openapi.json")
    assert r.status_code == 200
    flows = ("connect", "disconnect", "reconnect", "change_issuer", "reinstall", "rebind",
             "change_scopes")
    assert set(r.json()["paths"]) == {"/v1/commands", "/v1/commands/batch",
                                      "/v1/handoffs/reject", "/v1/handoffs",
                                      "/v1/openapi.json", "/v1/bindings/{binding_id}",
                                      *(f"/v1/bindings/{{binding_id}}/{f}" for f in flows)}


async def test_a_batch_is_answered_entry_by_entry(api: Api) -> None:
    first = await api.post("/v1/commands", body("int-old", outbox="ob-old"))
    assert first.status_code == 200
    entries = [
        body("int-b1", outbox="ob-b1"),
        body("int-old", outbox="ob-old"),  # a resend: the same command
        body("int-old", outbox="ob-other"),  # same key, other outbox: quarantined
        body("int-b2", scope=OTHER_ORG, outbox="ob-b2"),  # another scope's key
        body(operation="salesforce.nope"),  # invalid: nothing written for it
        {"effect_handoff_key": "nope"},
        body("int-b3", outbox="ob-b3"),
    ]
    r = await api.post("/v1/commands/batch", {"commands": entries})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [(a["status"], a.get("admission") or a.get("error")) for a in results] == [
        (200, "COMMAND_ACCEPTED"), (200, "COMMAND_ACCEPTED"), (409, "quarantined"),
        (403, "scope_mismatch"), (422, "unknown_operation"), (400, "bad_handoff_key"),
        (200, "COMMAND_ACCEPTED")]
    assert results[1]["command_id"] == first.json()["command_id"]
    assert "command_id" not in results[2] and "command_id" not in results[3]
    items = await api.store.work_list(WorkQuery(family="external_effect"))
    assert sorted(i.subject_id for i in items) == sorted(
        [first.json()["command_id"], results[0]["command_id"], results[6]["command_id"]])
    # The same batch again (a lost response): the same answers, nothing new.
    again = await api.post("/v1/commands/batch", {"commands": entries})
    assert [a.get("command_id") for a in again.json()["results"]] == [
        a.get("command_id") for a in results]
    assert len(await api.store.work_list(WorkQuery(family="external_effect"))) == 3


@pytest.mark.parametrize(
    ("doc", "token", "status", "error"),
    [
        ({"commands": [body()]}, None, 401, "unauthenticated"),
        ({"commands": [body()]}, "wrong", 401, "unauthenticated"),
        ([body()], RUNTIME_TOKEN, 400, "invalid_request"),
        ({"commands": []}, RUNTIME_TOKEN, 400, "invalid_request"),
        ({"commands": body()}, RUNTIME_TOKEN, 400, "invalid_request"),
        ({"commands": [body(f"int-{i}", outbox=f"ob-{i}") for i in range(101)]}, RUNTIME_TOKEN,
         400, "batch_too_large"),
    ],
)
async def test_a_bad_batch_is_refused_whole(api: Api, doc: Any, token: str | None, status: int,
                                            error: str) -> None:
    r = await api.post("/v1/commands/batch", doc, token=token)
    assert (r.status_code, r.json()["error"]) == (status, error), r.text
    assert r.json()["message"]
    assert await api.nothing_written()


async def test_an_oversized_batch_is_413(api: Api) -> None:
    big = {"commands": [body(f"int-{i}", outbox=f"ob-{i}", title="x" * 4_000)  # 80 x 4 KB > 256 KiB
                        for i in range(80)]}
    r = await api.post("/v1/commands/batch", big)
    assert (r.status_code, r.json()["error"]) == (413, "payload_too_large")
    assert await api.nothing_written()


# An early refusal (before the body is read) must leave the connection usable: the body
# arriving after the answer is read and dropped, or the server closes the connection.
# Today the second request on the socket is never answered (the GET stalls).
JSON = {"Content-Type": "application/json"}
BEARER = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}


@pytest.mark.parametrize(
    ("headers", "size", "status", "error"),
    [
        (JSON, 200_000, 401, "unauthenticated"),
        (JSON, 40, 401, "unauthenticated"),
        ({**JSON, "Authorization": "Bearer wrong"}, 200_000, 401, "unauthenticated"),
        ({**BEARER, "Content-Type": "text/plain"}, 200_000, 415, "unsupported_media_type"),
        ({**BEARER, "Content-Type": "text/plain"}, 40, 415, "unsupported_media_type"),
    ],
)
async def test_the_next_request_after_an_early_refusal_is_answered(
    api: Api, headers: dict[str, str], size: int, status: int, error: str
) -> None:
    for path in ("/v1/commands", "/v1/commands/batch", "/v1/handoffs/reject"):
        first, second = await refused_then_next(api.address, "POST", path, headers,
                                                b" " * size, "/v1/openapi.json")
        assert (first.status, json.loads(first.body)["error"]) == (status, error)
        # Within the body limit the body is read and dropped: the connection is reused.
        assert second is not None and second.status == 200, path
    assert await api.nothing_written()


async def test_an_early_refusal_of_a_body_over_the_limit_closes_the_connection(
    api: Api
) -> None:
    first, second = await refused_then_next(api.address, "POST", "/v1/commands", JSON,
                                            b" " * 300_000, "/v1/openapi.json")
    assert first.status == 401 and first.headers.get("connection") == "close"
    assert second is None
    assert await api.nothing_written()


@pytest.mark.parametrize(
    ("raw", "word"),
    [
        (b"[" * 1000, "deeper"),  # today: RecursionError, a 500 with a traceback
        (b'{"commands": ' + b"[" * 1000 + b"]" * 1000 + b"}", "deeper"),
        (b'{"effect_handoff_key": "\xff\xfe"}', "UTF-8"),
        (b"\xff\xfe{}", "UTF-8"),
        (b'{"x": NaN}', "not valid JSON"),
    ],
)
async def test_bodies_that_are_not_utf8_or_nest_too_deeply_are_a_json_400(
    api: Api, raw: bytes, word: str
) -> None:
    for path in ("/v1/commands", "/v1/commands/batch", "/v1/handoffs/reject"):
        r = await api.client.post(path, content=raw, headers={**BEARER, **JSON})
        assert (r.status_code, r.json()["error"]) == (400, "malformed_json"), (path, r.text)
        assert word in r.json()["message"]
    assert await api.nothing_written()


def _with(doc: dict[str, Any], *path: str, **extra: Any) -> dict[str, Any]:
    """``doc`` with ``extra`` fields added to the object at ``path``."""
    out: dict[str, Any] = json.loads(json.dumps(doc))
    target = out
    for key in path:
        target = target[key]
    target.update(extra)
    if path and path[0] == "command":
        out["payload_digest"] = canonical_digest(out["command"])  # still a valid digest
    return out


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        (_with(body(), extra="x"), "the body"),
        (_with(body(), "command", priority=1), "command"),
        (_with(body(), "command", "logical_target", account_id="a"), "logical_target"),
        (_with(body(), "command", "request", method="DELETE"), "request"),
    ],
)
async def test_fields_the_openapi_document_forbids_are_refused(
    api: Api, doc: dict[str, Any], where: str
) -> None:
    r = await api.post("/v1/commands", doc)
    assert (r.status_code, r.json()["error"]) == (400, "invalid_request"), r.text
    assert f"unknown field(s) in {where}" in r.json()["message"]
    batch = await api.post("/v1/commands/batch", {"commands": [doc]})
    assert batch.json()["results"][0]["error"] == "invalid_request"
    assert await api.nothing_written()


async def test_the_reject_and_batch_bodies_refuse_unknown_fields(api: Api) -> None:
    handoff = {k: body()[k] for k in ("effect_handoff_key", "payload_digest",
                                      "runtime_outbox_id")}
    r = await api.post("/v1/handoffs/reject", {**handoff, "command": body()["command"]})
    assert (r.status_code, r.json()["error"]) == (400, "invalid_request")
    r = await api.post("/v1/commands/batch", {"commands": [body()], "atomic": True})
    assert (r.status_code, r.json()["error"]) == (400, "invalid_request")
    assert await api.nothing_written()


@pytest.mark.parametrize(
    ("token", "challenge"),
    [(None, 'Bearer realm="integrationd"'),
     ("wrong", 'Bearer realm="integrationd", error="invalid_token"')],
)
async def test_a_401_carries_www_authenticate(api: Api, token: str | None,
                                              challenge: str) -> None:
    for r in (await api.post("/v1/commands", body(), token=token),
              await api.client.get("/v1/handoffs", params={"effect_handoff_key": "x"},
                                   headers={"Authorization": f"Bearer {token}"} if token
                                   else {})):
        assert r.status_code == 401
        assert r.headers["WWW-Authenticate"] == challenge
