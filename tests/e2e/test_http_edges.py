"""Issue 21, item 2: the HTTP edges of every listener (ingress, ``/v1/``, the console), on
one real ``integrationd run`` process, over raw loopback sockets: the test writes the
bytes and reads what comes back.

Findings (before): after a 413 or a 408 the server closed the connection without saying
``Connection: close``, so a keep-alive client's next request met end-of-stream; request
heads of 17-60 KiB passed a 16 KiB ``max_header_bytes`` (431 came only from 64 KiB); a
request with both ``Content-Length`` and ``Transfer-Encoding: chunked`` was accepted (and
on ingress stored), which RFC 9112 section 6.3 says to refuse (request smuggling); a 405
had no ``Allow`` header.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import trio

from config.catalog import load_catalog
from storage.ingress.receipts import ReceiptQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.processes import ReplicaProcess, run_cli, start_replica, stop_all
from tests.support.raw_http import ConnectionClosed, RawConnection, RawResponse
from tests.support.webhooks import (
    JSONAPI,
    OUTREACH_SECRET,
    ingress_settings,
    prospect_body,
    sign,
)

OUTREACH = load_catalog(ingress_settings(Path("/nonexistent"))).webhooks[
    "outreach.prospect_events"]
RUNTIME_TOKEN = "edges-runtime-token-0123456789"
MAX_HEADER = 16 * 1024   # [ingress] max_header_bytes, and every listener's bound


def _config(tmp: Path, url: str) -> Path:
    files = {"runtime.token": RUNTIME_TOKEN, "results.token": "results-token",
             "provider.token": "provider-token", "webhook.secret": OUTREACH_SECRET,
             "session.secret": "edges-session-secret-0123456789abcdef"}
    for name, value in files.items():
        (tmp / name).write_text(value + "\n")
    (tmp / "keys").mkdir()
    (tmp / "keys" / "k1.key").write_text(bytes(range(32)).hex() + "\n")
    config = tmp / "integrationd.toml"
    config.write_text(f"""
[storage]
url = "{url}"

[admin]
listen = "127.0.0.1:0"
session_secret_file = "{tmp}/session.secret"

[api]
listen = "127.0.0.1:0"

[ingress]
listen = "127.0.0.1:0"
spool_dir = "{tmp}/spool"
max_body_bytes = 4096
request_deadline = 1.0
db_deadline = 0.5

[keys]
active = "k1"
dir = "{tmp}/keys"

[[runtimes]]
name = "crm"
org_id = "org-1"
app_installation_id = "inst-1"
runtime_capability_id = "cap.leads"
runtime_work_binding_digest = "sha256:demo-binding"
results_url = "http://127.0.0.1:9/runtime/v1/results"
token_file = "{tmp}/runtime.token"
results_token_file = "{tmp}/results.token"

[[bindings]]
binding_id = "outreach-main"
provider = "outreach"
org_id = "org-1"
app_installation_id = "inst-1"
remote_account_id = "acct-1"
base_url = "http://127.0.0.1:9"

[[webhook_routes]]
route = "outreach-main"
binding_id = "outreach-main"
webhook = "outreach.prospect_events"
subscription_generation = 2
secret_file = "{tmp}/webhook.secret"

[[operators]]
name = "ada"
role = "admin"
""")
    return config


@attrs.frozen
class Listeners:
    replica: ReplicaProcess
    ingress: str
    api: str
    admin: str
    store: WorkStore


@pytest.fixture
async def listeners(database: FreshDatabase, tmp_path: Path) -> AsyncIterator[Listeners]:
    store = await database.open_store()
    config = _config(tmp_path, database.url)
    published = run_cli(config, "catalog", "publish", "--actor", "ada", "--reason", "e2e")
    assert published.returncode == 0, published.stderr
    replica = await start_replica(config, "edges")
    try:
        started = await replica.wait_event("replica_started")
        yield Listeners(replica, str(started["ingress"]), str(started["api"]),
                        str(started["admin"]), store)
    finally:
        await stop_all([replica])


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _exchange(address: str, data: bytes) -> tuple[RawResponse, RawConnection]:
    conn = await RawConnection.open(address)
    with trio.fail_after(10):
        await conn.send(data)
        return await conn.read_response(), conn


async def _then_closed(conn: RawConnection) -> bool:
    """Whether the server closed the connection after its answer (within 5 s)."""
    try:
        with trio.fail_after(5):
            return await conn.is_closed()
    finally:
        await conn.aclose()


# The listeners' paths: a route that accepts POST, and a path that answers 405 to DELETE.
def _paths(where: Listeners) -> dict[str, tuple[str, str]]:
    return {"ingress": (where.ingress, "/hooks/outreach-main"),
            "api": (where.api, "/v1/commands"),
            "console": (where.admin, "/admin/sign-in")}


LISTENERS = ("ingress", "api", "console")


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_413_says_connection_close_and_closes(listeners: Listeners) -> None:
    # The console checks its CSRF token before the body: a 403, its body unread too.
    expected = {"ingress": 413, "api": 413, "console": 403}
    for name in LISTENERS:
        address, path = _paths(listeners)[name]
        # Declared over every listener's body bound (ingress 4 KiB, /v1/ 256 KiB, the
        # console's): refused from the head, the body never read.
        answer, conn = await _exchange(address, _head("POST", path, {
            "content-type": "application/json", "content-length": str(64 * 1024 * 1024),
            "authorization": f"Bearer {RUNTIME_TOKEN}"}) + b"{")
        assert answer.status == expected[name], (name, answer.status)
        assert answer.headers.get("connection") == "close", (name, answer.headers)
        assert await _then_closed(conn), name


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_408_says_connection_close_and_closes(listeners: Listeners) -> None:
    body = prospect_body()
    # Half the body, then nothing: the ingress request_deadline (1 s) answers 408.
    answer, conn = await _exchange(listeners.ingress, _head(
        "POST", "/hooks/outreach-main", {
            "content-type": JSONAPI, "content-length": str(len(body)),
            **sign(OUTREACH, OUTREACH_SECRET, body)}) + body[:20])
    assert answer.status == 408, answer
    assert answer.headers.get("connection") == "close", answer.headers
    assert await _then_closed(conn)


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("size", [17 * 1024, 40 * 1024, 60 * 1024])
async def test_a_head_over_max_header_bytes_is_431_on_every_listener(
        listeners: Listeners, size: int) -> None:
    for name in LISTENERS:
        address, path = _paths(listeners)[name]
        answer, conn = await _exchange(address, _head("GET", path, {"x-pad": "p" * size}))
        assert answer.status == 431, (name, size, answer.status)
        assert answer.headers.get("connection") == "close", (name, answer.headers)
        assert await _then_closed(conn), name
    # Just under the bound: not refused for its size.
    address, path = _paths(listeners)["console"]
    answer, conn = await _exchange(address, _head("GET", path, {"x-pad": "p" * 15_000}))
    await conn.aclose()
    assert answer.status == 200, answer.status


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_content_length_with_chunked_is_refused_400_and_nothing_stored(
        listeners: Listeners) -> None:
    body = prospect_body()
    chunked = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    for name in LISTENERS:
        address, path = _paths(listeners)[name]
        headers = {"content-type": JSONAPI if name == "ingress" else "application/json",
                   "content-length": str(len(body)), "transfer-encoding": "chunked",
                   "authorization": f"Bearer {RUNTIME_TOKEN}",
                   **sign(OUTREACH, OUTREACH_SECRET, body)}
        answer, conn = await _exchange(address, _head("POST", path, headers) + chunked)
        assert answer.status == 400, (name, answer)
        assert json.loads(answer.body) == {
            "error": "ambiguous_length",
            "message": "a request may not carry both Content-Length and"
                       " Transfer-Encoding (RFC 9112 section 6.3)"}, name
        assert answer.headers.get("connection") == "close", (name, answer.headers)
        assert await _then_closed(conn), name
    assert await listeners.store.ingress_receipt_list(ReceiptQuery()) == []


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_405_names_the_allowed_methods(listeners: Listeners) -> None:
    # Quart answers OPTIONS on every route by itself (and HEAD with GET): named too.
    expected = {"ingress": "POST", "api": "OPTIONS, POST", "console": "GET, HEAD, OPTIONS, POST"}
    for name in LISTENERS:
        address, path = _paths(listeners)[name]
        answer, conn = await _exchange(address, _head("DELETE", path, {
            "authorization": f"Bearer {RUNTIME_TOKEN}"}))
        await conn.aclose()
        assert answer.status == 405, (name, answer.status)
        allowed = {m.strip() for m in answer.headers.get("allow", "").split(",") if m}
        assert allowed == set(expected[name].split(", ")), (name, answer.headers)


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_after_a_refusal_that_keeps_the_connection_the_next_request_is_answered(
        listeners: Listeners) -> None:
    """A refusal whose request was read whole (a bad signature) leaves the connection
    usable: the edges close only what they must."""
    body = prospect_body()
    conn = await RawConnection.open(listeners.ingress)
    try:
        with trio.fail_after(10):
            await conn.send(_head("POST", "/hooks/outreach-main", {
                "content-type": JSONAPI, "content-length": str(len(body)),
                "outreach-webhook-signature": "0" * 64}) + body)
            first = await conn.read_response()
            await conn.send(_head("POST", "/hooks/outreach-main", {
                "content-type": JSONAPI, "content-length": str(len(body)),
                **sign(OUTREACH, OUTREACH_SECRET, body)}) + body)
            try:
                second = await conn.read_response()
            except ConnectionClosed:
                second = None
    finally:
        await conn.aclose()
    assert first.status == 401 and "connection" not in first.headers
    assert second is not None and second.status == 200
