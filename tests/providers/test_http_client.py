"""The client under the executor and the receipt sender (``daemon/providers/http_client.py``):
what it reads of an answer, and what it does with a connection after each kind of answer,
against raw loopback servers (``tests/providers/raw_server.py``) on real sockets."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from daemon.core.effects import Phase
from daemon.providers.executor import BoundedHttp, HttpExecutor
from sandbox.h11_server import H11Server, Request, Response
from tests.providers.raw_server import Conn, RawServer, tls_pair
from tests.providers.test_exchange_outcomes import _prepared


async def test_a_chunked_answer_is_read_whole_and_its_connection_kept(
        nursery: trio.Nursery) -> None:
    async def chunked(conn: Conn) -> None:
        while await conn.read_request():
            await conn.stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                       b"transfer-encoding: chunked\r\n\r\n5\r\n{\"id\"\r\n")
            await trio.sleep(0.01)  # the rest in a later read
            await conn.stream.send_all(b"6\r\n:\"42\"}\r\n0\r\n\r\n")

    server = RawServer(chunked)
    port = await server.serve(nursery)
    http = BoundedHttp.open(2)
    for _ in range(2):
        answer = await http.request("GET", f"http://127.0.0.1:{port}/x", timeout_s=10.0)
        assert (answer.status_code, answer.json()) == (200, {"id": "42"})
    assert server.accepted == 1
    await http.aclose()


async def test_a_half_read_answer_never_leaves_its_connection_to_the_next_request(
        nursery: trio.Nursery, mock_clock: trio.testing.MockClock) -> None:
    """The first answer stops part-way and its read times out (maybe sent). The rest of
    it arrives later on that connection: the next request must not read it as its own
    answer, so it goes out on a new connection."""
    part, rest = trio.Event(), trio.Event()

    async def stalls_then_answers(conn: Conn) -> None:
        number = server.accepted
        await conn.read_request()
        if number == 1:
            await conn.stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{\"id\"")
            part.set()
            await rest.wait()
            await conn.stream.send_all(b':"42"}')
            await trio.sleep_forever()
        await conn.answer(b'{"id":"fresh"}')

    server = RawServer(stalls_then_answers)
    port = await server.serve(nursery)
    executor = HttpExecutor(BoundedHttp.open(1))
    outcome = []

    async def send() -> None:
        outcome.append(await executor.dispatch(_prepared(port), "t0k", timeout_s=5.0))

    async with trio.open_nursery() as sending:
        sending.start_soon(send)
        await part.wait()
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(5.1)
    assert (outcome[0][0].phase, outcome[0][0].detail) == (Phase.SENT, "ReadTimeout")
    rest.set()
    await trio.testing.wait_all_tasks_blocked()
    observation, evidence = await executor.dispatch(_prepared(port), "t0k", timeout_s=5.0)
    assert observation.phase is Phase.RESPONDED and evidence["id"] == "fresh"
    assert server.accepted == 2
    await executor.aclose()


async def test_bytes_after_an_answer_retire_its_connection(nursery: trio.Nursery) -> None:
    """A server that sends more than the answer (a second, stale answer nobody asked for)
    in the same segment: those bytes are already read, so the socket does not look
    readable; kept, the connection would hand them to the next request as its answer.
    Before (httpcore's pool): the next request read ``{"id":"stale"}``."""

    async def answers_twice(conn: Conn) -> None:
        number = server.accepted
        while await conn.read_request():
            stale = b'HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n{"id":"stale"}'
            body = b'{"id":"%d"}' % number
            await conn.stream.send_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body
                + (stale if number == 1 else b""))

    server = RawServer(answers_twice)
    port = await server.serve(nursery)
    http = BoundedHttp.open(1)
    first = await http.request("GET", f"http://127.0.0.1:{port}/a", timeout_s=10.0)
    second = await http.request("GET", f"http://127.0.0.1:{port}/b", timeout_s=10.0)
    assert (first.json(), second.json()) == ({"id": "1"}, {"id": "2"})
    assert server.accepted == 2
    await http.aclose()


async def test_expired_idle_connections_are_let_go_and_the_fresh_one_kept(
        nursery: trio.Nursery, mock_clock: trio.testing.MockClock) -> None:
    """Three connections idle; one is used again; later the two that idled past the
    expiry are closed as the next request comes, and that request goes out on the one
    that did not (the most recently used)."""
    arrived, release = trio.Event(), trio.Event()
    waiting: list[str] = []

    async def held(request: Request) -> Response:
        waiting.append(request.path)
        if len(waiting) == 3:
            arrived.set()
        if request.path.startswith("/held"):
            await release.wait()
        return Response(200, b"ok")

    server = H11Server(held)
    port: int = await nursery.start(server.run)
    url = f"http://127.0.0.1:{port}"
    http = BoundedHttp.open(4, {url: 10.0})
    async def hold(n: int) -> None:
        await http.request("GET", f"{url}/held{n}", timeout_s=100.0)

    async with trio.open_nursery() as three:
        for n in range(3):
            three.start_soon(hold, n)
        await arrived.wait()
        release.set()
    assert (server.connections_accepted, http.open_connections()) == (3, 3)
    mock_clock.jump(6.0)
    assert (await http.request("GET", f"{url}/a", timeout_s=100.0)).status_code == 200
    mock_clock.jump(6.0)  # the other two idled 12 s, the one just used 6 s
    assert (await http.request("GET", f"{url}/b", timeout_s=100.0)).status_code == 200
    assert (server.connections_accepted, http.open_connections()) == (3, 1)
    await http.aclose()
    assert http.open_connections() == 0


async def test_a_cancelled_exchange_closes_its_connection_and_frees_its_slot(
        nursery: trio.Nursery) -> None:
    """The caller gives up while the answer is awaited (its own cancel scope): the only
    slot comes back, and the connection, whose answer may still come, is not reused."""
    arrived = trio.Event()

    async def first_never_answers(conn: Conn) -> None:
        number = server.accepted
        while await conn.read_request():
            if number == 1:
                arrived.set()
                await trio.sleep_forever()
            await conn.answer()

    server = RawServer(first_never_answers)
    port = await server.serve(nursery)
    http = BoundedHttp.open(1)
    with trio.CancelScope() as caller:
        nursery.start_soon(lambda: _cancel_when(arrived, caller))
        await http.request("GET", f"http://127.0.0.1:{port}/a", timeout_s=100.0)
    assert caller.cancelled_caught
    answer = await http.request("GET", f"http://127.0.0.1:{port}/b", timeout_s=100.0)
    assert answer.json() == {"id": "42"} and server.accepted == 2
    assert http.open_connections() == 1
    await http.aclose()


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def test_answer_headers_read_as_httpx_reads_them(nursery: trio.Nursery) -> None:
    """Names in any case, a repeated header's values joined with ", " (the quota and
    evidence code reads them so), ``dict()`` of them keyed by lower-case names."""

    async def repeats_a_header(conn: Conn) -> None:
        while await conn.read_request():
            await conn.answer(b'{"id":"42"}', b"X-Rate: 1", b"x-rate: 2", b"Retry-After: 3")

    port = await RawServer(repeats_a_header).serve(nursery)
    http = BoundedHttp.open(1)
    answer = await http.request("GET", f"http://127.0.0.1:{port}/", timeout_s=10.0)
    assert answer.headers["X-RATE"] == "1, 2" and answer.headers.get("retry-after") == "3"
    assert "Retry-After" in answer.headers and "absent" not in answer.headers
    assert answer.headers.get("absent") is None
    assert dict(answer.headers) == {"content-type": "application/json", "x-rate": "1, 2",
                                    "retry-after": "3", "content-length": "11"}
    await http.aclose()


async def test_an_answer_head_over_the_limit_is_a_protocol_error(
        nursery: trio.Nursery) -> None:
    """An answer head over 100 KiB is not buffered on: the request was read, so the
    exchange stays maybe-sent."""

    async def huge_head(conn: Conn) -> None:
        await conn.read_request()
        await conn.answer(b"{}", b"x-filler: " + b"a" * (200 * 1024))

    port = await RawServer(huge_head).serve(nursery)
    executor = HttpExecutor()
    observation, _ = await executor.dispatch(_prepared(port), "t0k", timeout_s=10.0)
    assert (observation.phase, observation.detail) == (Phase.SENT, "RemoteProtocolError")
    await executor.aclose()


async def test_query_parameters_are_percent_encoded(nursery: trio.Nursery) -> None:
    targets: list[str] = []

    async def ok(request: Request) -> Response:
        targets.append(request.target)
        return Response(200, b"{}")

    port: int = await nursery.start(H11Server(ok).run)
    http = BoundedHttp.open(1)
    await http.request("GET", f"http://127.0.0.1:{port}/leads?x=1", timeout_s=10.0,
                       params={"field": "e mail", "value": "a&b/ü"})
    assert targets == ["/leads?x=1&field=e%20mail&value=a%26b%2F%C3%BC"]
    await http.aclose()


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "http:///x", "http://127.0.0.1:port/x"])
async def test_a_url_it_cannot_send_to_was_never_sent(url: str) -> None:
    http = BoundedHttp.open(1)
    with pytest.raises(httpx.UnsupportedProtocol):
        await http.request("GET", url, timeout_s=10.0)
    await http.aclose()


async def test_an_https_origin_keeps_its_tls_connection(nursery: trio.Nursery) -> None:
    async def answers(conn: Conn) -> None:
        while await conn.read_request():
            await conn.answer()

    server_tls, client_tls = tls_pair()
    server = RawServer(answers, tls=server_tls)
    port = await server.serve(nursery)
    http = BoundedHttp(2, tls=client_tls)
    for _ in range(3):
        answer = await http.request("GET", f"https://localhost:{port}/x", timeout_s=10.0)
        assert answer.json() == {"id": "42"}
    assert server.accepted == 1
    await http.aclose()


async def test_clients_closed_one_after_another_under_a_cancelled_scope_all_close(
        nursery: trio.Nursery) -> None:
    """An assembly closes its clients in turn in a ``finally`` whose scope is cancelled:
    one client's close must not raise Cancelled before the next one's has run. Before:
    the first ``aclose`` checkpointed, the second client's connections were left open
    (ResourceWarnings in the e2e slices)."""

    async def ok(request: Request) -> Response:
        return Response(200, b"{}")

    port: int = await nursery.start(H11Server(ok).run)
    first, second = BoundedHttp.open(1), BoundedHttp.open(1)
    for http in (first, second):
        await http.request("GET", f"http://127.0.0.1:{port}/", timeout_s=10.0)
    with trio.CancelScope() as scope:
        scope.cancel()
        await first.aclose()
        await second.aclose()
    assert (first.open_connections(), second.open_connections()) == (0, 0)
