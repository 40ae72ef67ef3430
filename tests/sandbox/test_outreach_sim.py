"""The Outreach simulator, served for real on loopback and driven by a real HTTP client;
its webhooks go to a real loopback receiver (``H11Server``) that can answer, fail with a
status, or reset the connection (a network failure)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import jwt
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sandbox.h11_server import ABORT, Abort, H11Server, Request, Response
from sandbox.hubspot_sim.model import Fault
from sandbox.outreach_sim import (
    CLEANUP_TOKEN_HEADER,
    JSONAPI,
    PROSPECTS_PATH,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    WEBHOOKS_PATH,
    OutreachSimulator,
)
from sandbox.outreach_sim.__main__ import TOKEN_ENV
from sandbox.s2s_token_sim import S2STokenEndpoint, s2s_routes

TOKEN = "s2s-test-token-9c2d"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": JSONAPI}
SECRET = "whsec-0123456789abcdef"


@attrs.define(eq=False)
class Receiver:
    """A webhook endpoint: records every request; answers ``status`` or resets."""

    received: list[Request] = attrs.field(factory=list)
    plan: list[int | None] = attrs.field(factory=list)  # per request: status, or None=reset
    port: int = 0

    async def handle(self, request: Request) -> Response | Abort:
        self.received.append(request)
        status = self.plan.pop(0) if self.plan else 200
        return ABORT if status is None else Response(status, b"")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/outreach"


@attrs.frozen
class Served:
    sim: OutreachSimulator
    url: str
    receiver: Receiver


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    sim = OutreachSimulator(tokens={TOKEN}, redelivery_delay=0.01, rate_limit=1000)
    port: int = await nursery.start(sim.run)
    receiver = Receiver()
    receiver.port = await nursery.start(H11Server(receiver.handle).run)
    return Served(sim, f"http://127.0.0.1:{port}", receiver)


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, headers=AUTH) as c:
        yield c


def patch_body(prospect_id: int, **attributes: Any) -> bytes:
    return json.dumps({"data": {"type": "prospect", "id": prospect_id,
                                "attributes": attributes}}).encode()


async def subscribe(client: httpx.AsyncClient, url: str, **extra: Any) -> dict[str, Any]:
    attributes = {"resource": "prospect", "action": "*", "url": url, "secret": SECRET,
                  "payloadVersion": 2, **extra}
    response = await client.post(WEBHOOKS_PATH, content=json.dumps(
        {"data": {"type": "webhook", "attributes": attributes}}))
    assert response.status_code == 201, response.text
    doc: dict[str, Any] = response.json()["data"]
    return doc


# ---- Prospects: read and write ----

async def test_get_and_patch_a_prospect(served: Served, client: httpx.AsyncClient) -> None:
    served.sim.put_prospect({"firstName": "Ada", "title": "Engineer"}, prospect_id=7)
    got = await client.get(f"{PROSPECTS_PATH}/7")
    assert got.status_code == 200
    assert got.headers["content-type"] == JSONAPI
    data = got.json()["data"]
    assert (data["type"], data["id"], data["attributes"]["title"]) == ("prospect", 7,
                                                                      "Engineer")
    patched = await client.patch(f"{PROSPECTS_PATH}/7", content=patch_body(7, title="CTO"))
    assert patched.status_code == 200
    assert patched.json()["data"]["attributes"]["title"] == "CTO"
    assert patched.json()["data"]["attributes"]["firstName"] == "Ada"  # sparse PATCH
    assert patched.json()["data"]["attributes"]["updatedAt"] > data["attributes"]["updatedAt"]
    assert [r.applied for r in served.sim.requests] == [False, True]


@pytest.mark.parametrize(("headers", "body", "status", "detail"), [
    ({"Content-Type": "application/json"}, patch_body(7, title="x"), 415, JSONAPI),
    ({}, b"{not json", 400, "not valid JSON"),
    ({}, b'{"data": []}', 400, "data"),
    ({}, patch_body(8, title="x"), 409, "data.id"),
    ({}, json.dumps({"data": {"type": "account", "id": 7}}).encode(), 409, "data.type"),
    ({}, patch_body(7, shoeSize="x"), 422, "unknown attribute shoeSize"),
    ({}, patch_body(7, updatedAt="2020-01-01T00:00:00.000Z"), 422, "read-only"),
])
async def test_bad_writes_are_clear_errors_and_change_nothing(
        served: Served, client: httpx.AsyncClient, headers: dict[str, str], body: bytes,
        status: int, detail: str) -> None:
    served.sim.put_prospect({"title": "Engineer"}, prospect_id=7)
    response = await client.patch(f"{PROSPECTS_PATH}/7", content=body, headers=headers)
    assert response.status_code == status
    assert detail in response.json()["errors"][0]["detail"]
    assert served.sim.prospect(7)["attributes"]["title"] == "Engineer"  # type: ignore[index]


async def test_unknown_prospect_is_404_and_wrong_token_401(
        served: Served, client: httpx.AsyncClient) -> None:
    assert (await client.get(f"{PROSPECTS_PATH}/99")).status_code == 404
    wrong = await client.get(f"{PROSPECTS_PATH}/99",
                             headers={"Authorization": "Bearer forged-7f3e"})
    assert wrong.status_code == 401
    assert "forged-7f3e" not in wrong.text  # the token is never echoed


async def test_rate_limit_headers_then_429(nursery: trio.Nursery) -> None:
    sim = OutreachSimulator(tokens={TOKEN}, rate_limit=2)
    port = await nursery.start(sim.run)
    sim.put_prospect({}, prospect_id=1)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=AUTH) as c:
        first = await c.get(f"{PROSPECTS_PATH}/1")
        second = await c.get(f"{PROSPECTS_PATH}/1")
        third = await c.get(f"{PROSPECTS_PATH}/1")
    assert first.headers["x-ratelimit-limit"] == "2"
    assert [first.headers["x-ratelimit-remaining"],
            second.headers["x-ratelimit-remaining"]] == ["1", "0"]
    assert third.status_code == 429
    assert int(third.headers["retry-after"]) > 0


async def test_the_rate_headers_a_client_test_can_ask_for(nursery: trio.Nursery) -> None:
    """A 429 without Retry-After (only x-ratelimit-reset says when), the reset as an
    epoch time, or a text sent verbatim; and a new limit per window."""
    clock = [1_800_000_000_000_000]
    sim = OutreachSimulator(tokens={TOKEN}, retry_after_on_429=False,
                            reset_format="epoch_seconds", clock=lambda: clock[0])
    sim.set_rate(1, window_s=30.0)
    port = await nursery.start(sim.run)
    sim.put_prospect({}, prospect_id=1)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=AUTH) as c:
        first = await c.get(f"{PROSPECTS_PATH}/1")
        second = await c.get(f"{PROSPECTS_PATH}/1")
        sim.reset_text = "soon"
        third = await c.get(f"{PROSPECTS_PATH}/1")
    assert (first.headers["x-ratelimit-remaining"], first.headers["x-ratelimit-reset"]) == (
        "0", "1800000030")
    assert second.status_code == 429 and "retry-after" not in second.headers
    assert second.headers["x-ratelimit-reset"] == "1800000030"
    assert third.headers["x-ratelimit-reset"] == "soon"
    with pytest.raises(ValueError, match="must be positive"):
        sim.set_rate(0)
    with pytest.raises(ValueError, match="reset_format"):
        OutreachSimulator(tokens=set(), reset_format="minutes")


async def test_injected_rate_limit_and_reset_faults(served: Served,
                                                    client: httpx.AsyncClient) -> None:
    served.sim.put_prospect({"title": "a"}, prospect_id=1)
    served.sim.inject(Fault(mode="rate_limit", path_prefix="/api/v2/", retry_after_s=3))
    served.sim.inject(Fault(mode="reset_after", method="PATCH", path_prefix="/api/v2/"))
    throttled = await client.get(f"{PROSPECTS_PATH}/1")
    assert (throttled.status_code, throttled.headers["retry-after"]) == (429, "3")
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        await client.patch(f"{PROSPECTS_PATH}/1", content=patch_body(1, title="b"))
    # The answer was lost, the change was not.
    assert served.sim.prospect(1)["attributes"]["title"] == "b"  # type: ignore[index]


# ---- the list: filter, sort, cursor pages ----

async def walk(client: httpx.AsyncClient, params: dict[str, str]) -> list[list[int]]:
    pages: list[list[int]] = []
    response = await client.get(PROSPECTS_PATH, params=params)
    while True:
        assert response.status_code == 200, response.text
        doc = response.json()
        pages.append([row["id"] for row in doc["data"]])
        nxt = doc["links"].get("next")
        if nxt is None:
            return pages
        response = await client.get(nxt)


async def test_default_page_is_50_and_links_next_walks_everything(
        served: Served, client: httpx.AsyncClient) -> None:
    for n in range(1, 121):
        served.sim.put_prospect({"firstName": f"P{n}"}, prospect_id=n)
    pages = await walk(client, {})
    assert [len(p) for p in pages] == [50, 50, 20]
    assert [i for p in pages for i in p] == list(range(1, 121))


async def test_equal_updated_at_across_pages_is_neither_skipped_nor_doubled(
        served: Served, client: httpx.AsyncClient) -> None:
    for n in range(1, 31):
        served.sim.put_prospect({"title": "old"}, prospect_id=n)
    served.sim.update_prospect(30, {"title": "earlier"}, updated_at="2030-01-01T00:00:00.000Z",
                               notify=False)
    stamp = "2030-01-01T00:00:05.123Z"
    served.sim.bulk_update(list(range(1, 26)), {"title": "bulk"}, updated_at=stamp,
                           notify=False)
    pages = await walk(client, {"filter[updatedAt]": "2030-01-01T00:00:00.000Z..inf",
                                "sort": "updatedAt", "page[size]": "7"})
    seen = [i for p in pages for i in p]
    # Prospect 30 first (older stamp), then the 25 of one stamp in id order, each once,
    # though the pages cut through the run of equal stamps.
    assert seen == [30, *range(1, 26)]
    assert [len(p) for p in pages] == [7, 7, 7, 5]
    # The lower bound is inclusive at the wire's full precision.
    exact = await walk(client, {"filter[updatedAt]": f"{stamp}..inf", "sort": "updatedAt"})
    assert exact == [list(range(1, 26))]


@pytest.mark.parametrize(("params", "detail"), [
    ({"page[size]": "0"}, "page[size]"),
    ({"page[size]": "1001"}, "page[size]"),
    ({"sort": "title"}, "sort"),
    ({"filter[updatedAt]": "yesterday"}, "range"),
    ({"filter[updatedAt]": "2030-01-01T00:00:00..inf"}, "Z suffix"),
    ({"page[after]": "bm90LWEtY3Vyc29y"}, "cursor"),
])
async def test_bad_list_parameters_are_400(client: httpx.AsyncClient,
                                           params: dict[str, str], detail: str) -> None:
    response = await client.get(PROSPECTS_PATH, params=params)
    assert response.status_code == 400
    assert detail in response.json()["errors"][0]["detail"]


# ---- subscriptions ----

async def test_subscriptions_create_list_delete_and_cleanup_token(
        served: Served, client: httpx.AsyncClient) -> None:
    first = await subscribe(client, served.receiver.url)
    cleanup = first["meta"]["cleanupToken"]
    assert first["attributes"]["payloadVersion"] == 2
    assert "secret" not in first["attributes"]
    listed = (await client.get(WEBHOOKS_PATH)).json()["data"]
    assert [w["id"] for w in listed] == [first["id"]]
    assert "meta" not in listed[0] and SECRET not in json.dumps(listed)
    async with httpx.AsyncClient(base_url=served.url) as anonymous:
        path = f"{WEBHOOKS_PATH}/{first['id']}"
        bad = await anonymous.delete(path, headers={CLEANUP_TOKEN_HEADER: "wrong"})
        assert bad.status_code == 401
        assert (await anonymous.delete(path)).status_code == 401
        good = await anonymous.delete(path, headers={CLEANUP_TOKEN_HEADER: cleanup})
        assert good.status_code == 204
    assert served.sim.subscriptions() == []
    second = await subscribe(client, served.receiver.url)
    assert (await client.delete(f"{WEBHOOKS_PATH}/{second['id']}")).status_code == 204
    assert (await client.delete(f"{WEBHOOKS_PATH}/{second['id']}")).status_code == 404


@pytest.mark.parametrize(("extra", "detail"), [
    ({"payloadVersion": 3}, "payloadVersion"),
    ({"resource": "account"}, "resource"),
    ({"action": "merged"}, "action"),
    ({"url": "ftp://x"}, "url"),
])
async def test_bad_subscriptions_are_422(served: Served, client: httpx.AsyncClient,
                                         extra: dict[str, Any], detail: str) -> None:
    attributes = {"resource": "prospect", "action": "*", "url": served.receiver.url,
                  "payloadVersion": 2, **extra}
    response = await client.post(WEBHOOKS_PATH, content=json.dumps(
        {"data": {"type": "webhook", "attributes": attributes}}))
    assert response.status_code == 422
    assert detail in response.json()["errors"][0]["detail"]
    assert served.sim.subscriptions() == []


# ---- the webhook sender ----

async def test_signed_partial_version_2_deliveries(served: Served,
                                                   client: httpx.AsyncClient) -> None:
    await subscribe(client, served.receiver.url)
    served.sim.put_prospect({"firstName": "Ada", "title": "Engineer"}, prospect_id=5)
    served.sim.update_prospect(5, {"title": "CTO", "firstName": "Ada"})
    served.sim.destroy_prospect(5)
    await served.sim.wait_deliveries_settled()
    bodies = []
    for request in served.receiver.received:
        expected = hmac.new(SECRET.encode(), request.body, hashlib.sha256).hexdigest()
        assert request.headers[SIGNATURE_HEADER.lower()] == expected
        assert request.headers["content-type"] == JSONAPI
        bodies.append(json.loads(request.body))
    # Each delivery is sent on its own (as Outreach does), so they may arrive in any order.
    by_event = {body["meta"]["eventName"]: body for body in bodies}
    assert sorted(by_event) == ["prospect.destroyed", "prospect.updated"]
    updated, destroyed = by_event["prospect.updated"], by_event["prospect.destroyed"]
    assert updated["meta"]["deliveredAt"].endswith("Z")
    # Only what changed (firstName was set to the same value), and the prior values.
    assert set(updated["data"]["attributes"]) == {"title", "updatedAt"}
    assert updated["beforeUpdate"]["title"] == "Engineer"
    assert (updated["data"]["type"], updated["data"]["id"]) == ("prospect", 5)
    assert destroyed["data"]["attributes"] == {}
    assert [d.outcome for d in served.sim.deliveries] == ["delivered", "delivered"]


async def test_one_change_reaches_every_subscription_with_one_delivered_at(
        served: Served, client: httpx.AsyncClient) -> None:
    # A clock that moves a millisecond at every reading: the copies of one change must
    # still be one event (only their signatures differ), however long the fan-out takes.
    ticks = iter(range(1_767_225_600_000_000, 1_767_225_700_000_000, 1000))
    served.sim.clock = lambda: next(ticks)
    await subscribe(client, served.receiver.url, action="updated")
    served.sim.subscribe_direct(resource="prospect", action="updated",
                                url=served.receiver.url, secret="another-secret")
    served.sim.put_prospect({"title": "a"}, prospect_id=1)
    served.sim.update_prospect(1, {"title": "b"})
    await served.sim.wait_deliveries_settled()
    assert len(served.receiver.received) == 2
    assert len({r.body for r in served.receiver.received}) == 1
    assert len({r.headers[SIGNATURE_HEADER.lower()] for r in served.receiver.received}) == 2


async def test_any_status_is_delivered_network_failures_are_redelivered(
        served: Served, client: httpx.AsyncClient) -> None:
    await subscribe(client, served.receiver.url, action="updated")
    served.sim.put_prospect({"title": "a"}, prospect_id=1)
    served.receiver.plan = [500]
    served.sim.update_prospect(1, {"title": "b"})
    await served.sim.wait_deliveries_settled()
    assert len(served.receiver.received) == 1  # a 500 is "delivered": gone
    served.receiver.plan = [None, None]
    served.sim.update_prospect(1, {"title": "c"})
    await served.sim.wait_deliveries_settled()
    retried = served.receiver.received[1:]
    assert len(retried) == 3
    assert len({r.body for r in retried}) == 1  # the same body, byte for byte
    ids = [r.headers[REQUEST_ID_HEADER.lower()] for r in retried]
    assert len(set(ids)) == 3  # a new per-request id each time
    outcomes = [(d.attempt, d.outcome) for d in served.sim.deliveries[1:]]
    assert outcomes == [(1, "network_error"), (2, "network_error"), (3, "delivered")]


async def test_redelivery_gives_up_after_three_retries(served: Served,
                                                      client: httpx.AsyncClient) -> None:
    await subscribe(client, served.receiver.url, action="updated")
    served.sim.put_prospect({"title": "a"}, prospect_id=1)
    served.receiver.plan = [None] * 10
    served.sim.update_prospect(1, {"title": "b"})
    await served.sim.wait_deliveries_settled()
    assert len(served.receiver.received) == 4
    assert [d.outcome for d in served.sim.deliveries] == ["network_error"] * 4


async def test_dropped_deliveries_never_arrive(served: Served,
                                               client: httpx.AsyncClient) -> None:
    await subscribe(client, served.receiver.url, action="updated")
    served.sim.put_prospect({"title": "a"}, prospect_id=1)
    served.sim.drop_deliveries(1)
    served.sim.update_prospect(1, {"title": "b"})
    served.sim.update_prospect(1, {"title": "c"})
    await served.sim.wait_deliveries_settled()
    assert [json.loads(r.body)["data"]["attributes"]["title"]
            for r in served.receiver.received] == ["c"]
    assert [d.outcome for d in served.sim.deliveries] == ["dropped", "delivered"]


async def test_a_delivery_in_flight_when_the_sender_stops_is_journaled_interrupted() -> None:
    """The sender stopped (shut down, restarted: the simulation's ``restart_simulator``)
    while a delivery's request was in flight: its bytes may have reached the receiver,
    which may durably have stored it, so the journal must still show the attempt (seed 11
    at --duration 30: a receipt whose body the journal never showed, judged "a receipt of
    a body never sent")."""
    arrived = trio.Event()

    async def hold(request: Request) -> Response | Abort:
        arrived.set()  # the receiver has the whole request; it never answers
        await trio.sleep_forever()

    sim = OutreachSimulator(tokens={TOKEN}, redelivery_delay=0.01)
    receiver = Receiver()
    async with trio.open_nursery() as nursery:
        receiver.port = await nursery.start(H11Server(hold).run)
        with trio.CancelScope() as sender:
            await nursery.start(sim.run)
            sim.subscribe_direct(resource="prospect", action="updated", secret=SECRET,
                                 url=receiver.url)
            sim.put_prospect({"title": "a"}, prospect_id=1)
            sim.update_prospect(1, {"title": "b"})
            await arrived.wait()
            sender.cancel()
        nursery.cancel_scope.cancel()
    assert [(d.attempt, d.outcome, d.status) for d in sim.deliveries] == [
        (1, "interrupted", None)]
    assert sim.deliveries[0].request_id  # the attempt's own Outreach-Webhook-ID


async def test_a_disabled_or_unmatched_subscription_gets_nothing(
        served: Served, client: httpx.AsyncClient) -> None:
    created_only = await subscribe(client, served.receiver.url, action="created")
    served.sim.put_prospect({"title": "a"}, prospect_id=1)
    served.sim.update_prospect(1, {"title": "b"})
    served.sim.set_subscription_active(created_only["id"], False)
    served.sim.put_prospect({"title": "a"}, prospect_id=2, notify=True)
    await served.sim.wait_deliveries_settled()
    assert served.receiver.received == []


# ---- the control API ----

async def test_control_api_bulk_update_and_bad_input(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as control:
        for n in (1, 2):
            made = await control.post("/_sim/prospects", json={"id": n, "attributes": {}})
            assert made.status_code == 200
        stamp = "2031-05-05T05:05:05.505Z"
        bulk = await control.post("/_sim/bulk_update", json={
            "ids": [1, 2], "attributes": {"stage": "cold"}, "updatedAt": stamp})
        assert bulk.json() == {"updated": 2}
        for n in (1, 2):
            state = (await control.get(f"/_sim/prospects/{n}")).json()
            assert state["attributes"]["updatedAt"] == stamp
        assert (await control.post("/_sim/bulk_update", json={
            "ids": [1, 3], "attributes": {}, "updatedAt": stamp})).status_code == 404
        bad = await control.post("/_sim/prospects", json={"attributes": {"nope": 1}})
        assert (bad.status_code, bad.json()["error"]) == (400, "attributes: unknown attribute nope")
        assert (await control.post("/_sim/drop", json={"count": "x"})).status_code == 400
        assert (await control.post("/_sim/tokens", json={"token": "t2"})).status_code == 200
        fault = await control.post("/_sim/faults", json={"mode": "status", "status": 503})
        assert fault.json()["armed"]["path_prefix"] == "/api/v2/"
    assert "t2" in served.sim.tokens


# ---- python -m sandbox.outreach_sim ----

REPO = Path(__file__).resolve().parents[2]


async def test_cli_serves_seeded_prospects_and_stops_on_sigterm(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# sandbox token\n{TOKEN}\n")
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    command = [sys.executable, "-m", "sandbox.outreach_sim", "--port", "0",
               "--token-file", str(token_file), "--seed-prospects", "3"]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(trio.run_process, command, cwd=REPO, env=env, check=False,
                    stderr=subprocess.PIPE))
        assert process.stderr is not None
        line = b""
        with trio.fail_after(30):  # a guard against a hung child, not a timing assertion
            while not line.endswith(b"\n"):
                chunk = await process.stderr.receive_some(1)
                assert chunk, "the simulator exited before listening"
                line += chunk
        ready = json.loads(line)
        assert ready["event"] == "outreach_sim_listening"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ready['port']}",
                                     headers=AUTH) as c:
            assert (await c.get(f"{PROSPECTS_PATH}/3")).json()["data"]["attributes"][
                "firstName"] == "P3"
            assert (await c.get(f"{PROSPECTS_PATH}/4")).status_code == 404
        process.send_signal(signal.SIGTERM)
        assert await process.wait() == 0


async def test_cli_without_tokens_or_with_a_used_port_exits_2(served: Served) -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    no_tokens = await trio.run_process(
        [sys.executable, "-m", "sandbox.outreach_sim", "--port", "0"], cwd=REPO, env=env,
        check=False, capture_stderr=True)
    assert no_tokens.returncode == 2
    assert json.loads(no_tokens.stderr)["event"] == "outreach_sim_usage_error"
    port = int(served.url.rsplit(":", 1)[1])
    in_use = await trio.run_process(
        [sys.executable, "-m", "sandbox.outreach_sim", "--port", str(port)], cwd=REPO,
        env={**env, TOKEN_ENV: TOKEN}, check=False, capture_stderr=True)
    assert in_use.returncode == 2
    assert json.loads(in_use.stderr)["event"] == "outreach_sim_bind_failed"


async def test_a_mounted_s2s_token_endpoint_mints_tokens_the_api_accepts(
        nursery: trio.Nursery) -> None:
    """``python -m sandbox`` mounts wire9's token endpoint on the simulator's port,
    sharing the token set: a minted token reads Prospects; a bad JWT mints nothing."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    sim = OutreachSimulator(tokens={TOKEN})
    s2s = S2STokenEndpoint(app_id="app-1", public_key_pem=public, installs={"inst-1"},
                           access_tokens=sim.tokens)
    sim.mounts.extend(s2s_routes(s2s))
    sim.put_prospect({"firstName": "Ada"}, prospect_id=7)
    port = await nursery.start(sim.run)
    now = int(time.time())
    app_jwt = jwt.encode({"iss": "app-1", "iat": now, "exp": now + 60}, key, algorithm="RS256")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    forged = jwt.encode({"iss": "app-1", "iat": now, "exp": now + 60}, other,
                        algorithm="RS256")
    mint = "/api/app/installs/inst-1/actions/accessToken"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        refused = await http.post(mint, headers={"Authorization": f"Bearer {forged}"})
        assert refused.status_code == 401
        assert sim.tokens == {TOKEN}
        minted = await http.post(mint, headers={"Authorization": f"Bearer {app_jwt}"})
        assert minted.status_code == 200, minted.text
        token = minted.json()["token"]
        read = await http.get(f"{PROSPECTS_PATH}/7", headers={
            "Authorization": f"Bearer {token}", "Content-Type": JSONAPI})
        assert read.status_code == 200, read.text
        assert read.json()["data"]["attributes"]["firstName"] == "Ada"
    # The mount answered before the provider's own handling: not in its journal.
    assert [r.path for r in sim.requests] == [f"{PROSPECTS_PATH}/7"]
