"""How far one exchange got, against raw loopback servers that misbehave on purpose.

The executor talks to its own HTTP/1.1 client (h11 over trio streams); what the DoOnce
journal relies on is the classification of every failure: ``NOT_CONNECTED`` only where no
byte of the request can have reached the server, ``SENT`` (maybe delivered, maybe acted
on) everywhere else, and ``RESPONDED`` with the answer's status and evidence. Each row is
one server behaviour, on a real TCP socket (and a real TLS handshake for the TLS rows)."""

from __future__ import annotations

import gzip

import httpx
import pytest
import trio
import trio.testing

from config.definitions import AuthScheme, ResponseDefinition
from daemon.core.effects import Phase
from daemon.providers.executor import BoundedHttp, HttpExecutor, PreparedRequest
from daemon.providers.template import Pointer
from tests.providers.raw_server import Behaviour, Conn, RawServer, tls_pair


def _prepared(port: int, scheme: str = "http") -> PreparedRequest:
    return PreparedRequest(
        method="PATCH", url=f"{scheme}://localhost:{port}/objects/42", path="/objects/42",
        body=b'{"properties":{"title":"x"}}', safe_headers={"Content-Type": "application/json"},
        body_sha256="sha256:x", idempotency_key="k1", desired={"title": "x"}, remote_id="42",
        auth=AuthScheme(name="bearer", header="Authorization", prefix="Bearer "),
        response=ResponseDefinition(evidence_fields=(("id", Pointer.compile("/id")),)),
        idempotency_header="Idempotency-Key")


async def _answers(conn: Conn) -> None:
    while await conn.read_request():
        await conn.answer()


async def _closes_after_reading(conn: Conn) -> None:
    await conn.read_request()


async def _breaks_off_mid_body(conn: Conn) -> None:
    await conn.read_request()
    await conn.stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"id\":")


async def _garbled(conn: Conn) -> None:
    await conn.read_request()
    await conn.stream.send_all(b"SURE THING\r\n\r\n")


async def _gzipped(conn: Conn) -> None:
    head = await conn.read_request()
    assert b"accept-encoding: gzip" in head.lower()
    await conn.answer(gzip.compress(b'{"id":"42"}'), b"content-encoding: gzip")


async def _bad_gzip(conn: Conn) -> None:
    await conn.read_request()
    await conn.answer(b"not gzip at all", b"content-encoding: gzip")


@pytest.mark.parametrize(("behaviour", "phase", "detail"), [
    (_answers, Phase.RESPONDED, ""),
    (_gzipped, Phase.RESPONDED, ""),
    (_closes_after_reading, Phase.SENT, "RemoteProtocolError"),
    (_breaks_off_mid_body, Phase.SENT, "RemoteProtocolError"),
    (_garbled, Phase.SENT, "RemoteProtocolError"),
    (_bad_gzip, Phase.SENT, "DecodingError"),
], ids=["answered", "gzip", "closed-after-reading", "broke-off-mid-body", "garbled",
        "garbled-gzip"])
async def test_how_far_an_exchange_got(nursery: trio.Nursery, behaviour: Behaviour,
                                       phase: Phase, detail: str) -> None:
    server = RawServer(behaviour)
    port = await server.serve(nursery)
    executor = HttpExecutor()
    observation, evidence = await executor.dispatch(_prepared(port), "t0k", timeout_s=10.0)
    assert (observation.phase, observation.detail) == (phase, detail)
    if phase is Phase.RESPONDED:
        assert observation.status == 200 and evidence == {"status": 200, "id": "42"}
    else:  # may have been delivered: the request's excerpt is kept for the journal
        assert observation.exchange is not None
    assert server.accepted == 1
    await executor.aclose()


async def test_a_refused_connection_was_never_sent() -> None:
    with trio.socket.socket() as probe:  # a port nobody listens on
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    executor = HttpExecutor()
    observation, _ = await executor.dispatch(_prepared(port), "t0k", timeout_s=10.0)
    assert (observation.phase, observation.detail) == (Phase.NOT_CONNECTED, "ConnectError")
    await executor.aclose()


async def test_a_server_that_never_answers_times_out_as_sent(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    read = trio.Event()

    async def never_answers(conn: Conn) -> None:
        await conn.read_request()
        read.set()
        await trio.sleep_forever()

    port = await RawServer(never_answers).serve(nursery)
    executor = HttpExecutor()
    outcome = []

    async def send() -> None:
        outcome.append(await executor.dispatch(_prepared(port), "t0k", timeout_s=5.0))

    async with trio.open_nursery() as sending:
        sending.start_soon(send)
        await read.wait()
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(4.9)
        await trio.testing.wait_all_tasks_blocked()
        assert not outcome  # the per-call timeout, not an earlier one
        mock_clock.jump(0.2)
    observation, _ = outcome[0]
    assert (observation.phase, observation.detail) == (Phase.SENT, "ReadTimeout")
    await executor.aclose()


@pytest.mark.parametrize("closing", ["idle-closed", "connection-close"])
async def test_a_connection_the_server_closed_is_never_reused(
    nursery: trio.Nursery, closing: str
) -> None:
    """After the answer the server closes the connection, silently (an idle close) or
    as it said it would (``Connection: close``): the next request goes out on a new
    connection and is answered, never written into the closed one (which would fail as
    maybe-sent)."""
    closed = trio.Event()

    async def one_per_connection(conn: Conn) -> None:
        await conn.read_request()
        await conn.answer(b'{"id":"42"}', *([b"connection: close"]
                                             if closing == "connection-close" else []))
        await conn.stream.aclose()
        closed.set()

    server = RawServer(one_per_connection)
    port = await server.serve(nursery)
    executor = HttpExecutor(BoundedHttp.open(1))
    for _ in range(3):
        observation, _ = await executor.dispatch(_prepared(port), "t0k", timeout_s=10.0)
        assert (observation.phase, observation.status) == (Phase.RESPONDED, 200)
        await closed.wait()
        closed = trio.Event()
        await trio.sleep(0.01)  # the close's FIN arrives on loopback
    assert server.accepted == 3
    await executor.aclose()


@pytest.mark.parametrize(("trusted", "phase"), [(True, Phase.RESPONDED),
                                                 (False, Phase.NOT_CONNECTED)],
                         ids=["trusted", "untrusted"])
async def test_tls(nursery: trio.Nursery, trusted: bool, phase: Phase) -> None:
    """An untrusted certificate fails the handshake, before any byte of the request."""
    server_tls, client_tls = tls_pair()
    server = RawServer(_answers, tls=server_tls)
    port = await server.serve(nursery)
    http = BoundedHttp(4, tls=client_tls) if trusted else BoundedHttp.open(4)
    executor = HttpExecutor(http)
    observation, _ = await executor.dispatch(_prepared(port, "https"), "t0k", timeout_s=10.0)
    assert observation.phase is phase
    if not trusted:
        assert observation.detail == "ConnectError"
    await executor.aclose()


async def test_a_body_cut_short_by_its_write_timeout_is_sent_and_leaves_nothing_behind(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """A server that stops reading: the body's write times out part-way. Maybe delivered
    (its head and part of its body left), and no half-iterated body stream is left for
    the garbage collector (trio warns about an unexhausted async generator)."""
    connected = trio.Event()

    async def stops_reading(conn: Conn) -> None:
        connected.set()
        await trio.sleep_forever()

    port = await RawServer(stops_reading).serve(nursery)
    http = BoundedHttp.open(1)
    outcome: list[BaseException] = []

    async def send() -> None:
        with pytest.raises(httpx.WriteTimeout) as caught:
            await http.request("POST", f"http://127.0.0.1:{port}/big", timeout_s=5.0,
                               content=b"x" * (64 * 1024 * 1024))
        outcome.append(caught.value)

    async with trio.open_nursery() as sending:
        sending.start_soon(send)
        await connected.wait()
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(5.1)
    assert len(outcome) == 1
    await http.aclose()
