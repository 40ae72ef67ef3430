"""The HubSpot simulator, served for real on loopback and driven by a real HTTP client.

Every test starts the server in the test's nursery (cancelled at test end) and
talks to it with ``httpx.AsyncClient`` or a raw trio socket when the bytes on the
wire are the point (TCP resets, malformed HTTP).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from sandbox.h11_server import H11Server, Request, Response
from sandbox.hubspot_sim import CONTACTS_PATH, MAX_BODY, Fault, HubSpotSimulator
from sandbox.hubspot_sim.__main__ import TOKEN_ENV

TOKEN = "test-token-4f1c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONNECTION_ERRORS = (httpx.ReadError, httpx.RemoteProtocolError)
REPO = Path(__file__).resolve().parents[2]


@attrs.frozen
class Served:
    sim: HubSpotSimulator
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def served(nursery: trio.Nursery) -> Served:
    sim = HubSpotSimulator(tokens={TOKEN})
    sim.add_contact("1", jobtitle=None, email="ada@example.com")
    port: int = await nursery.start(sim.run)
    return Served(sim, port)


@pytest.fixture
async def client(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=served.url, headers=AUTH) as c:
        yield c


def contact_url(contact_id: str) -> str:
    return f"{CONTACTS_PATH}/{contact_id}"


async def patch_jobtitle(
    client: httpx.AsyncClient, contact_id: str, title: str, **headers: str
) -> httpx.Response:
    return await client.patch(
        contact_url(contact_id), json={"properties": {"jobtitle": title}}, headers=headers
    )


async def read_to_eof(stream: trio.SocketStream) -> bytes:
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    return received


# ---- provider API: happy paths ----


async def test_get_contact_returns_hubspot_shape(client: httpx.AsyncClient) -> None:
    response = await client.get(contact_url("1"))
    assert response.status_code == 200
    doc = response.json()
    assert doc["id"] == "1"
    assert doc["properties"] == {"jobtitle": None, "email": "ada@example.com"}
    assert doc["archived"] is False
    assert doc["createdAt"].endswith("Z") and doc["createdAt"] == doc["updatedAt"]


async def test_get_contact_with_selected_properties(client: httpx.AsyncClient) -> None:
    response = await client.get(contact_url("1"), params={"properties": "jobtitle,phone"})
    assert response.json()["properties"] == {"jobtitle": None, "phone": None}


async def test_patch_applies_bumps_updated_at_and_is_journaled(
    served: Served, client: httpx.AsyncClient
) -> None:
    before = (await client.get(contact_url("1"))).json()
    response = await patch_jobtitle(client, "1", "CTO", **{"Idempotency-Key": "key-1"})
    assert response.status_code == 200
    doc = response.json()
    assert doc["properties"] == {"jobtitle": "CTO", "email": "ada@example.com"}
    assert doc["updatedAt"] > before["updatedAt"]
    assert served.sim.patches_applied("1") == 1
    record = served.sim.requests[-1]
    assert (record.seq, record.method, record.path) == (2, "PATCH", contact_url("1"))
    assert (record.contact_id, record.applied, record.status) == ("1", True, 200)
    assert record.idempotency_key == "key-1"
    assert len(record.body_sha256) == 64
    # The journal never carries credentials.
    assert TOKEN not in repr(served.sim.requests) and TOKEN not in repr(served.sim)


async def test_a_seeded_contact_can_be_backdated_and_a_patch_still_moves_it_forward(
    served: Served, client: httpx.AsyncClient
) -> None:
    # 2026-01-01T00:00:00.000Z: a contact last modified long before the test.
    served.sim.put_contact("7", {"jobtitle": "Engineer"}, modified_ms=1_767_225_600_000)
    doc = (await client.get(contact_url("7"))).json()
    assert (doc["createdAt"], doc["updatedAt"]) == ("2026-01-01T00:00:00.000Z",) * 2
    await patch_jobtitle(client, "7", "CTO")
    after = (await client.get(contact_url("7"))).json()
    assert after["updatedAt"] > doc["updatedAt"] and after["createdAt"] == doc["createdAt"]


async def test_patch_null_clears_a_property(served: Served, client: httpx.AsyncClient) -> None:
    response = await client.patch(contact_url("1"), json={"properties": {"email": None}})
    assert response.status_code == 200
    assert served.sim.contact("1") is not None
    assert response.json()["properties"]["email"] is None


async def test_post_creates_contact_with_new_numeric_id(
    served: Served, client: httpx.AsyncClient
) -> None:
    response = await client.post(CONTACTS_PATH, json={"properties": {"jobtitle": "CFO"}})
    assert response.status_code == 201
    new_id = response.json()["id"]
    assert new_id.isdigit() and new_id != "1"
    fetched = await client.get(contact_url(new_id))
    assert fetched.json()["properties"] == {"jobtitle": "CFO"}
    assert served.sim.requests[0].contact_id == new_id and served.sim.requests[0].applied


# ---- provider API: errors ----


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["missing", "invalid", "wrong-scheme"],
)
async def test_bad_credentials_get_401(served: Served, headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(base_url=served.url, headers=headers) as anonymous:
        response = await anonymous.patch(contact_url("1"), json={"properties": {"jobtitle": "x"}})
    assert response.status_code == 401
    assert response.json()["category"] == "INVALID_AUTHENTICATION"
    assert response.json()["status"] == "error"
    assert served.sim.patches_applied("1") == 0
    assert served.sim.requests[-1].applied is False


async def test_unknown_contact_is_404_for_get_and_patch(
    served: Served, client: httpx.AsyncClient
) -> None:
    got = await client.get(contact_url("999"))
    patched = await patch_jobtitle(client, "999", "CTO")
    for response in (got, patched):
        assert response.status_code == 404
        assert response.json()["category"] == "OBJECT_NOT_FOUND"
    assert [r.applied for r in served.sim.requests] == [False, False]
    assert served.sim.contact("999") is None


@pytest.mark.parametrize(
    "path", ["/crm/v3/objects/deals/1", "/nope", f"{CONTACTS_PATH}/1/extra", f"{CONTACTS_PATH}/"]
)
async def test_unknown_route_is_404_json(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert response.json()["status"] == "error"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("DELETE", contact_url("1"), "GET, PATCH"), ("GET", CONTACTS_PATH, "POST")],
)
async def test_wrong_method_is_405(
    client: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    response = await client.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["status"] == "error"


async def test_head_gets_headers_without_a_body(client: httpx.AsyncClient) -> None:
    response = await client.head(contact_url("1"))
    assert response.status_code == 405
    assert response.content == b""
    assert int(response.headers["content-length"]) > 0
    assert (await client.get(contact_url("1"))).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b'{"jobtitle": "CTO"}',
        b'{"properties": ["CTO"]}',
        b'{"properties": {"jobtitle": 7}}',
        b'{"properties": {"jobtitle": "CTO"}, "extra": 1}',
        b"[" * 5000,
    ],
)
async def test_malformed_or_misshapen_body_is_400(
    served: Served, client: httpx.AsyncClient, body: bytes
) -> None:
    response = await client.patch(
        contact_url("1"), content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["category"] == "VALIDATION_ERROR"
    assert served.sim.patches_applied("1") == 0


async def test_non_json_content_type_is_415(served: Served, client: httpx.AsyncClient) -> None:
    response = await client.patch(
        contact_url("1"),
        content=b'{"properties": {"jobtitle": "CTO"}}',
        headers={"Content-Type": "text/plain"},
    )
    assert response.status_code == 415
    assert served.sim.patches_applied("1") == 0


def body_of_size(size: int) -> bytes:
    """A valid PATCH body of exactly ``size`` bytes."""
    frame = b'{"properties": {"jobtitle": ""}}'
    padding = size - len(frame)
    return b'{"properties": {"jobtitle": "' + b"x" * padding + b'"}}'


async def test_body_limit_is_64_kib_and_413_keeps_the_connection(
    served: Served, client: httpx.AsyncClient
) -> None:
    headers = {"Content-Type": "application/json"}
    at_limit = await client.patch(contact_url("1"), content=body_of_size(MAX_BODY), headers=headers)
    assert at_limit.status_code == 200
    over = await client.patch(contact_url("1"), content=body_of_size(MAX_BODY + 1), headers=headers)
    assert over.status_code == 413
    assert served.sim.requests[-1].body_sha256 == ""
    after = await client.get(contact_url("1"))
    assert after.status_code == 200
    assert served.sim.patches_applied("1") == 1
    assert served.sim.connections_accepted == 1


async def test_keep_alive_serves_many_requests_on_one_connection(
    served: Served, client: httpx.AsyncClient
) -> None:
    for n in range(5):
        assert (await patch_jobtitle(client, "1", f"title {n}")).status_code == 200
        assert (await client.get(contact_url("1"))).status_code == 200
    assert served.sim.connections_accepted == 1
    assert served.sim.patches_applied("1") == 5
    assert [r.seq for r in served.sim.requests] == list(range(1, 11))


async def test_concurrent_clients(served: Served) -> None:
    clients, patches_each = 4, 25
    for n in range(clients):
        served.sim.add_contact(str(100 + n), jobtitle=None)
    statuses: list[int] = []

    async def one_client(n: int) -> None:
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH) as c:
            for i in range(patches_each):
                statuses.append((await patch_jobtitle(c, str(100 + n), f"t{i}")).status_code)

    async with trio.open_nursery() as nursery:
        for n in range(clients):
            nursery.start_soon(one_client, n)
    assert statuses == [200] * (clients * patches_each)
    assert [served.sim.patches_applied(str(100 + n)) for n in range(clients)] == [25] * 4
    assert [r.seq for r in served.sim.requests] == list(range(1, clients * patches_each + 1))
    assert served.sim.connections_accepted == clients


async def test_malformed_http_gets_400_then_close(served: Served) -> None:
    async with await trio.open_tcp_stream("127.0.0.1", served.port) as stream:
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        received = await read_to_eof(stream)
    assert received.startswith(b"HTTP/1.1 400 ")
    assert served.sim.requests == []


# ---- the HTTP layer on its own ----


async def echo_size(request: Request) -> Response:
    if request.path == "/boom":
        raise RuntimeError("a handler bug")
    status = 413 if request.body_too_large else 200
    return Response(status, str(len(request.body)).encode())


async def test_server_survives_a_handler_bug(nursery: trio.Nursery) -> None:
    server = H11Server(echo_size)
    port: int = await nursery.start(server.run)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
        assert (await c.get("/boom")).status_code == 500
        assert (await c.post("/", content=b"abc")).text == "3"
    assert server.connections_accepted == 1


async def test_body_past_the_drain_limit_gets_413_and_close(nursery: trio.Nursery) -> None:
    server = H11Server(echo_size, max_body=10, drain_limit=100)
    port: int = await nursery.start(server.run)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        await stream.send_all(b"x" * 1000)
        received = await read_to_eof(stream)
    assert received.startswith(b"HTTP/1.1 413 ")
    assert b"connection: close" in received.lower()


async def test_expect_100_continue_is_honoured(nursery: trio.Nursery) -> None:
    port: int = await nursery.start(H11Server(echo_size).run)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n"
            b"Connection: close\r\n\r\n"
        )
        interim = await stream.receive_some(65536)
        assert interim.startswith(b"HTTP/1.1 100 ")
        await stream.send_all(b"abcd")
        final = await read_to_eof(stream)
    assert final.startswith(b"HTTP/1.1 200 ") and final.endswith(b"\r\n\r\n4")


# ---- faults ----


async def test_latency_fault_delays_then_applies(served: Served, client: httpx.AsyncClient) -> None:
    served.sim.inject(Fault(mode="latency", latency_ms=20))
    response = await patch_jobtitle(client, "1", "CTO")
    assert response.status_code == 200
    assert served.sim.patches_applied("1") == 1
    assert served.sim.pending_faults() == []


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_status_fault_answers_without_applying(
    served: Served, client: httpx.AsyncClient, status: int
) -> None:
    served.sim.inject(Fault(mode="status", status=status))
    response = await patch_jobtitle(client, "1", "CTO")
    assert response.status_code == status
    assert response.json()["status"] == "error"
    assert served.sim.patches_applied("1") == 0
    assert served.sim.contact("1") is not None
    assert (await client.get(contact_url("1"))).json()["properties"]["jobtitle"] is None
    record = served.sim.requests[0]
    assert (record.applied, record.status) == (False, status)


async def test_rate_limit_fault_is_429_with_retry_after(
    served: Served, client: httpx.AsyncClient
) -> None:
    served.sim.inject(Fault(mode="rate_limit", retry_after_s=7))
    response = await patch_jobtitle(client, "1", "CTO")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["category"] == "RATE_LIMITS"
    assert served.sim.patches_applied("1") == 0
    assert (await patch_jobtitle(client, "1", "CTO")).status_code == 200


async def test_reset_before_drops_the_request_unapplied(
    served: Served, client: httpx.AsyncClient
) -> None:
    served.sim.inject(Fault(mode="reset_before"))
    with pytest.raises(CONNECTION_ERRORS):
        await patch_jobtitle(client, "1", "CTO", **{"Idempotency-Key": "k"})
    assert served.sim.patches_applied("1") == 0
    record = served.sim.requests[0]
    assert (record.applied, record.status, record.idempotency_key) == (False, None, "k")
    # The client's next request opens a fresh connection and goes through.
    assert (await patch_jobtitle(client, "1", "CTO")).status_code == 200
    assert served.sim.connections_accepted == 2


async def test_reset_after_applies_but_never_answers(
    served: Served, client: httpx.AsyncClient
) -> None:
    served.sim.inject(Fault(mode="reset_after"))
    with pytest.raises(CONNECTION_ERRORS):
        await patch_jobtitle(client, "1", "CTO")
    assert served.sim.patches_applied("1") == 1
    record = served.sim.requests[0]
    assert (record.applied, record.status) == (True, None)
    state = (await client.get(contact_url("1"))).json()
    assert state["properties"]["jobtitle"] == "CTO"


async def test_other_record_fault_answers_200_naming_another_id_unapplied(
    served: Served, client: httpx.AsyncClient
) -> None:
    served.sim.inject(Fault(mode="other_record", record_id="777", method="PATCH"))
    response = await patch_jobtitle(client, "1", "CTO")
    assert response.status_code == 200
    assert response.json()["id"] == "777"
    assert served.sim.patches_applied("1") == 0
    assert (await client.get(contact_url("1"))).json()["properties"]["jobtitle"] is None
    record = served.sim.requests[0]
    assert (record.applied, record.status, record.contact_id) == (False, 200, "1")


async def test_other_record_fault_over_the_control_api(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as control:
        armed = await control.post("/_sim/faults", json={"mode": "other_record",
                                                        "record_id": "42"})
        assert armed.status_code == 201, armed.text
        assert armed.json()["armed"]["record_id"] == "42"
        bad = await control.post("/_sim/faults", json={"mode": "other_record",
                                                      "record_id": 42})
        assert bad.status_code == 400
        assert "record_id" in bad.json()["message"]


@pytest.mark.parametrize("mode", ["reset_before", "reset_after"])
async def test_reset_is_a_tcp_rst_with_no_response_bytes(served: Served, mode: str) -> None:
    served.sim.inject(Fault(mode=mode))  # type: ignore[arg-type]
    body = b'{"properties":{"jobtitle":"CTO"}}'
    head = (
        f"PATCH {contact_url('1')} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    async with await trio.open_tcp_stream("127.0.0.1", served.port) as stream:
        await stream.send_all(head + body)
        # ECONNRESET, not an orderly EOF: the client cannot mistake it for a response.
        with pytest.raises(trio.BrokenResourceError):
            await stream.receive_some(65536)
    assert served.sim.patches_applied("1") == (1 if mode == "reset_after" else 0)


async def test_faults_are_taken_in_order_and_by_count(
    served: Served, client: httpx.AsyncClient
) -> None:
    served.sim.inject(Fault(mode="status", status=500, count=2))
    served.sim.inject(Fault(mode="status", status=502))
    assert served.sim.pending_faults()[0][1] == 2
    statuses = [(await patch_jobtitle(client, "1", f"t{n}")).status_code for n in range(4)]
    assert statuses == [500, 500, 502, 200]
    assert served.sim.patches_applied("1") == 1
    assert served.sim.pending_faults() == []


async def test_fault_is_taken_by_the_first_matching_request(
    served: Served, client: httpx.AsyncClient
) -> None:
    served.sim.inject(Fault(mode="status", status=500, method="patch"))  # any case
    served.sim.inject(Fault(mode="status", status=502, method="GET"))
    served.sim.inject(Fault(mode="rate_limit", path_prefix=contact_url("2")))
    served.sim.add_contact("2", jobtitle=None)
    # The GET skips the PATCH-only fault at the head of the queue.
    assert (await client.get(contact_url("1"))).status_code == 502
    assert (await client.get(contact_url("1"))).status_code == 200
    assert (await patch_jobtitle(client, "1", "CTO")).status_code == 500
    assert (await patch_jobtitle(client, "1", "CTO")).status_code == 200
    assert (await patch_jobtitle(client, "2", "CTO")).status_code == 429
    assert served.sim.pending_faults() == []


async def test_control_requests_never_take_faults(served: Served) -> None:
    served.sim.inject(Fault(mode="reset_before", path_prefix="/"))
    async with httpx.AsyncClient(base_url=served.url) as control:
        assert (await control.get("/_sim/faults")).json()["faults"][0]["remaining"] == 1
    assert served.sim.requests == []


async def test_clear_faults(served: Served, client: httpx.AsyncClient) -> None:
    served.sim.inject(Fault(mode="status", count=3))
    assert served.sim.clear_faults() == 1
    assert (await patch_jobtitle(client, "1", "CTO")).status_code == 200


@pytest.mark.parametrize(
    "kwargs",
    [{"mode": "explode"}, {"mode": "status", "count": 0}, {"mode": "status", "status": 200},
     {"mode": "latency", "latency_ms": -1}],
)
def test_fault_rejects_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (attrs' validators raise plain ValueError)
        Fault(**kwargs)


@pytest.mark.parametrize(
    "doc",
    [[], {"mode": "latency", "latency_ms": "10"}, {"mode": "status", "count": True},
     {"mode": "status", "bogus": 1}, {"method": "GET"}],
)
def test_fault_from_json_rejects_nonsense(doc: object) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        Fault.from_json(doc)


# ---- control API over HTTP ----


async def test_control_api_drives_the_simulator(served: Served) -> None:
    async with (
        httpx.AsyncClient(base_url=served.url) as control,
        httpx.AsyncClient(base_url=served.url, headers=AUTH) as provider,
    ):
        seeded = await control.post(
            "/_sim/contacts", json={"id": "42", "properties": {"jobtitle": "Dev"}}
        )
        assert seeded.status_code == 200 and seeded.json()["patches_applied"] == 0

        armed = await control.post("/_sim/faults", json={"mode": "status", "status": 500})
        assert armed.status_code == 201
        assert (await patch_jobtitle(provider, "42", "CTO")).status_code == 500
        assert (await patch_jobtitle(provider, "42", "CTO")).status_code == 200

        state = (await control.get("/_sim/contacts/42")).json()
        assert state["properties"] == {"jobtitle": "CTO"} and state["patches_applied"] == 1

        journal = (await control.get("/_sim/requests")).json()["requests"]
        assert [(r["seq"], r["status"], r["applied"]) for r in journal] == [
            (1, 500, False), (2, 200, True)
        ]
        assert "authorization" not in json.dumps(journal).lower()
        later = (await control.get("/_sim/requests", params={"since": 1})).json()["requests"]
        assert [r["seq"] for r in later] == [2]

        await control.post("/_sim/faults", json={"mode": "rate_limit", "count": 2})
        assert (await control.delete("/_sim/faults")).json() == {"cleared": 1}
        assert (await control.get("/_sim/faults")).json() == {"faults": []}

        assert (await control.post("/_sim/reset")).status_code == 200
        assert (await control.get("/_sim/contacts/42")).status_code == 404
        assert (await control.get("/_sim/requests")).json() == {"requests": []}
        assert served.sim.requests == [] and served.sim.patches_applied("42") == 0


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/_sim/faults", b'{"mode": "explode"}', 400),
        ("POST", "/_sim/faults", b"{", 400),
        ("POST", "/_sim/contacts", b'{"properties": {}}', 400),
        ("POST", "/_sim/contacts", b'{"id": "1", "properties": {"a": 1}}', 400),
        ("GET", "/_sim/contacts/nobody", b"", 404),
        ("GET", "/_sim/requests?since=x", b"", 400),
        ("GET", "/_sim/reset", b"", 405),
        ("GET", "/_sim/nothing", b"", 404),
    ],
)
async def test_control_api_errors(
    served: Served, method: str, path: str, body: bytes, status: int
) -> None:
    async with httpx.AsyncClient(base_url=served.url) as control:
        response = await control.request(method, path, content=body)
    assert response.status_code == status
    assert response.json()["status"] == "error"


# ---- standalone process ----


async def test_cli_serves_seeded_contacts_and_stops_on_sigterm(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# sandbox token\n{TOKEN}\n")
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    command = [sys.executable, "-m", "sandbox.hubspot_sim", "--port", "0",
               "--token-file", str(token_file), "--seed-contacts", "3"]
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(trio.run_process, command, cwd=REPO, env=env, check=False,
                    stderr=subprocess.PIPE)
        )
        assert process.stderr is not None
        line = b""
        with trio.fail_after(30):  # a guard against a hung child, not a timing assertion
            while not line.endswith(b"\n"):
                chunk = await process.stderr.receive_some(1)
                assert chunk, "the simulator exited before listening"
                line += chunk
        ready = json.loads(line)
        assert ready["event"] == "hubspot_sim_listening"
        url = f"http://127.0.0.1:{ready['port']}"
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as c:
            contact = (await c.get(contact_url("3"))).json()
            assert contact["properties"] == {"jobtitle": None}
            assert (await c.get(contact_url("4"))).status_code == 404
        process.send_signal(signal.SIGTERM)
        assert await process.wait() == 0


async def test_cli_without_tokens_is_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    result = await trio.run_process(
        [sys.executable, "-m", "sandbox.hubspot_sim", "--port", "0"],
        cwd=REPO, env=env, check=False, capture_stderr=True,
    )
    assert result.returncode == 2
    assert json.loads(result.stderr)["event"] == "hubspot_sim_usage_error"


async def test_cli_reports_a_port_in_use(served: Served) -> None:
    result = await trio.run_process(
        [sys.executable, "-m", "sandbox.hubspot_sim", "--port", str(served.port)],
        cwd=REPO, env={**os.environ, TOKEN_ENV: TOKEN}, check=False, capture_stderr=True,
    )
    assert result.returncode == 2
    assert json.loads(result.stderr)["event"] == "hubspot_sim_bind_failed"


async def test_rate_headers_count_this_apps_requests_of_the_last_10_s(
    served: Served, client: httpx.AsyncClient
) -> None:
    served.sim.rate_limit = 5
    served.sim.other_client_requests = 1
    remaining = []
    for _ in range(3):
        resp = await client.get(f"{CONTACTS_PATH}/1")
        assert resp.headers["x-hubspot-ratelimit-max"] == "5"
        assert resp.headers["x-hubspot-ratelimit-interval-milliseconds"] == "10000"
        remaining.append(resp.headers["x-hubspot-ratelimit-remaining"])
    # Each answer counts itself, the ones before it and the other client's request.
    assert remaining == ["3", "2", "1"]


def test_rate_headers_count_out_of_order_arrivals_at_their_own_time() -> None:
    sim = HubSpotSimulator(tokens={TOKEN}, rate_limit=100)
    # A latency fault records a request later than it arrived: arrivals come a little
    # out of order; each is counted at its arrival time, the window is (now - 10 s, now].
    for at in (1000.0, 1005.0, 1003.0, 1009.0, 1010.0, 1002.0):
        sim._arrive(at)
    remaining = dict(sim._rate_headers(1010.0))["x-hubspot-ratelimit-remaining"]
    assert remaining == str(100 - 5)  # all but the one at 1000.0 (exactly 10 s before)
    assert dict(sim._rate_headers(1012.5))["x-hubspot-ratelimit-remaining"] == str(100 - 4)
    # Much later, old arrivals are forgotten (memory stays bounded) and never counted.
    sim._arrive(1200.0)
    assert sim._arrivals == [1200.0]
    assert dict(sim._rate_headers(1200.0))["x-hubspot-ratelimit-remaining"] == "99"
    sim.reset()
    assert dict(sim._rate_headers(1200.0))["x-hubspot-ratelimit-remaining"] == "100"


@pytest.mark.parametrize("honour", [True, False])
async def test_an_idempotency_key_is_honoured_only_when_asked(
        served: Served, client: httpx.AsyncClient, honour: bool) -> None:
    """The sandbox's stand-in for a provider whose L1 declares a replay proof: a PATCH
    repeating an applied Idempotency-Key is answered as the first and applies nothing.
    HubSpot itself ignores the header (off by default, as the shipped L1 says)."""
    served.sim.honour_idempotency_keys = honour
    first = await patch_jobtitle(client, "1", "CTO", **{"Idempotency-Key": "cmd-1"})
    again = await patch_jobtitle(client, "1", "CTO", **{"Idempotency-Key": "cmd-1"})
    other = await patch_jobtitle(client, "1", "CEO", **{"Idempotency-Key": "cmd-2"})
    assert (first.status_code, again.status_code, other.status_code) == (200, 200, 200)
    assert [r.applied for r in served.sim.requests] == [True, not honour, True]
    assert served.sim.patches_applied("1") == (2 if honour else 3)
    if honour:
        assert again.json() == first.json()  # the first answer, byte for byte in meaning
