"""EarlyRefusalGuard at the ASGI level: what reaches the server, in which order, row by row.

The server side is played by the test (a receive queue it fills and the list of
messages the guard sends on); the app answers at once without reading its body,
as an early refusal does. Real HTTP over hypercorn is covered by the raw-socket
tests of each listener; here the rows that are hard to reach there: a chunked
body, a body over the bound, a client that never sends its body (MockClock).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from daemon.services.http_guard import DRAIN_TIMEOUT_S, EarlyRefusalGuard, Message, Receive, Send

LIMIT = 1000


async def refuse_at_once(scope: Message, receive: Receive, send: Send) -> None:
    """An app that answers 401 without reading the body, while a reader (as Quart's) keeps
    receiving in the background until the request is over."""
    async def reader() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"no", "more_body": False})
        nursery.cancel_scope.cancel()


def scope(headers: list[tuple[bytes, bytes]]) -> Message:
    return {"type": "http", "method": "POST", "path": "/", "headers": headers}


async def exchange(headers: list[tuple[bytes, bytes]], chunks: list[tuple[float, bytes, bool]],
                   ) -> list[tuple[float, dict[str, Any]]]:
    """Run the guarded app; the client's body ``chunks`` arrive (delay, data, more) after the
    answer has started. Returns (time, message) for what the server was sent."""
    send_body, receive_body = trio.open_memory_channel[Message](100)
    sent: list[tuple[float, dict[str, Any]]] = []
    started = trio.Event()
    start = trio.current_time()

    async def send(message: Message) -> None:
        sent.append((trio.current_time() - start, dict(message)))
        started.set()

    async def client() -> None:
        await started.wait()
        for delay, data, more in chunks:
            await trio.sleep(delay)
            await send_body.send({"type": "http.request", "body": data, "more_body": more})
        await trio.sleep(3600)  # a keep-alive connection: no disconnect until it closes

    guard = EarlyRefusalGuard(refuse_at_once, LIMIT)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        await guard(scope(headers), receive_body.receive, send)
        nursery.cancel_scope.cancel()
    return sent


def _closes(message: dict[str, Any]) -> bool:
    return (b"connection", b"close") in message.get("headers", [])


async def test_a_late_body_within_the_bound_is_awaited_before_the_answer_ends(
    autojump_clock: object,
) -> None:
    sent = await exchange([(b"content-length", b"500")],
                          [(1.0, b"x" * 250, True), (1.0, b"x" * 250, False)])
    kinds = [(m["type"], m.get("body"), m.get("more_body")) for _, m in sent]
    assert kinds == [("http.response.start", None, None),
                     ("http.response.body", b"no", True),  # the answer's bytes at once
                     ("http.response.body", b"", False)]   # its end once the body is in
    assert not _closes(sent[0][1])
    assert sent[1][0] == 0 and sent[2][0] == pytest.approx(2.0)


async def test_a_chunked_body_is_awaited_too(autojump_clock: object) -> None:
    sent = await exchange([(b"transfer-encoding", b"chunked")],
                          [(0.5, b"x" * 10, True), (0.5, b"", False)])
    assert not _closes(sent[0][1]) and sent[-1][1]["more_body"] is False
    assert sent[-1][0] == pytest.approx(1.0)


async def test_a_chunked_body_over_the_bound_is_not_awaited_to_its_end(
    autojump_clock: object,
) -> None:
    sent = await exchange([(b"transfer-encoding", b"chunked")],
                          [(0.5, b"x" * (LIMIT + 1), True), (1000.0, b"", False)])
    assert sent[-1][1]["more_body"] is False
    assert sent[-1][0] == pytest.approx(0.5)  # gave up at the bound: the server closes


async def test_a_body_that_never_comes_is_awaited_for_the_timeout_only(
    autojump_clock: object,
) -> None:
    sent = await exchange([(b"content-length", b"500")], [])
    assert sent[1][1]["more_body"] is True  # the client has the whole answer at once
    assert sent[-1][0] == pytest.approx(DRAIN_TIMEOUT_S)


@pytest.mark.parametrize("length", [LIMIT + 1, 10**9])
async def test_a_declared_body_over_the_bound_gets_connection_close(
    autojump_clock: object, length: int,
) -> None:
    sent = await exchange([(b"content-length", str(length).encode())], [])
    assert _closes(sent[0][1])
    assert [m.get("more_body") for _, m in sent[1:]] == [False]  # no waiting at all
    assert sent[-1][0] == 0


@pytest.mark.parametrize("headers", [[], [(b"content-length", b"0")]])
async def test_a_request_without_a_body_passes_through(
    autojump_clock: object, headers: list[tuple[bytes, bytes]],
) -> None:
    sent = await exchange(headers, [])
    assert [m["type"] for _, m in sent] == ["http.response.start", "http.response.body"]
    assert not _closes(sent[0][1]) and sent[-1][0] == 0
