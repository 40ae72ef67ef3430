"""BoundedHttp: one request per pooled connection; a wait past the timeout sends nothing."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from daemon.providers.executor import (
    SAFE_KEEPALIVE_S,
    Answer,
    BoundedHttp,
    HttpExecutor,
    SendWindowClosed,
    keepalive_below,
)
from sandbox.h11_server import H11Server, Request, Response


async def test_a_request_waits_for_a_free_connection_then_times_out_unsent(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    seen: list[str] = []
    arrived, release, answered = trio.Event(), trio.Event(), trio.Event()

    async def slow(request: Request) -> Response:
        seen.append(request.path)
        arrived.set()
        await release.wait()
        return Response(200, b"done")

    port: int = await nursery.start(H11Server(slow).run)
    http = BoundedHttp.open(1)
    first: list[Answer] = []

    async def hold_the_only_connection() -> None:
        first.append(await http.request("GET", f"http://127.0.0.1:{port}/first",
                                        timeout_s=1000.0))
        answered.set()

    nursery.start_soon(hold_the_only_connection)
    await arrived.wait()
    async with trio.open_nursery() as waiting:
        outcome: list[BaseException] = []

        async def second() -> None:
            with pytest.raises(httpx.PoolTimeout) as caught:
                await http.request("GET", f"http://127.0.0.1:{port}/second", timeout_s=5.0)
            outcome.append(caught.value)

        waiting.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(5.0)
    assert len(outcome) == 1 and seen == ["/first"]  # the second request never left
    release.set()
    await answered.wait()
    assert first[0].text == "done"
    # The slot came back: the next request goes out on the same connection.
    third = await http.request("GET", f"http://127.0.0.1:{port}/third", timeout_s=1000.0)
    assert third.status_code == 200 and seen == ["/first", "/third"]
    await http.aclose()


async def test_each_origin_keeps_its_connections(nursery: trio.Nursery) -> None:
    async def ok(request: Request) -> Response:
        return Response(200, b"ok")

    servers = [H11Server(ok) for _ in range(5)]
    ports = [await nursery.start(server.run) for server in servers]
    http = BoundedHttp.open(4)
    for _ in range(3):  # round-robin over more origins than one client has connections
        for port in ports:
            response = await http.request("GET", f"http://127.0.0.1:{port}/", timeout_s=10.0)
            assert response.status_code == 200
    # Kept alive: one connection per origin, never closed to make room for another.
    assert [s.connections_accepted for s in servers] == [1] * len(servers)
    await http.aclose()


async def test_a_providers_set_cookie_is_never_sent_back(nursery: trio.Nursery) -> None:
    """One client serves every principal of an origin: a cookie one binding's answer sets
    must never ride on another binding's request (nor on the same binding's: integrationd
    authenticates each request itself)."""
    cookies: list[str | None] = []

    async def sets_a_cookie(request: Request) -> Response:
        cookies.append(request.headers.get("cookie"))
        return Response(200, b"ok", (("set-cookie", "session=binding-a; Path=/"),))

    port: int = await nursery.start(H11Server(sets_a_cookie).run)
    http = BoundedHttp.open(4)
    for path in ("/a", "/b", "/c"):
        answer = await http.request("GET", f"http://127.0.0.1:{port}{path}", timeout_s=10.0)
        assert answer.status_code == 200
    assert cookies == [None, None, None]
    await http.aclose()


async def test_a_closed_send_gate_sends_nothing_and_keeps_the_connection(
    nursery: trio.Nursery,
) -> None:
    seen: list[str] = []

    async def ok(request: Request) -> Response:
        seen.append(request.path)
        return Response(200, b"ok")

    server = H11Server(ok)
    port: int = await nursery.start(server.run)
    http = BoundedHttp.open(1)
    url = f"http://127.0.0.1:{port}"
    assert (await http.request("GET", f"{url}/open", timeout_s=10.0,
                               may_send=lambda: True)).status_code == 200
    with pytest.raises(SendWindowClosed):
        await http.request("POST", f"{url}/closed", timeout_s=10.0, content=b"x",
                           may_send=lambda: False)
    assert seen == ["/open"]
    # The gate is asked before the request is framed: nothing was written on the
    # connection, so the next request is answered in full on the same one.
    after = await http.request("GET", f"{url}/after", timeout_s=10.0)
    assert after.text == "ok" and seen == ["/open", "/after"]
    assert server.connections_accepted == 1
    await http.aclose()


async def test_the_send_gate_is_asked_after_the_wait_for_a_connection(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """A quota slot is a time window: a request that waited for a free connection past
    its window must not leave, though the window was open when it started waiting."""
    seen: list[str] = []
    arrived, release = trio.Event(), trio.Event()

    async def slow(request: Request) -> Response:
        seen.append(request.path)
        if request.path == "/first":
            arrived.set()
            await release.wait()
        return Response(200, b"done")

    port: int = await nursery.start(H11Server(slow).run)
    http = BoundedHttp.open(1)
    window_closes = trio.current_time() + 0.25
    outcome: list[BaseException] = []

    async def first() -> None:
        await http.request("GET", f"http://127.0.0.1:{port}/first", timeout_s=1000.0)

    async def second() -> None:
        with pytest.raises(SendWindowClosed) as caught:
            await http.request("PATCH", f"http://127.0.0.1:{port}/second", timeout_s=1000.0,
                               may_send=lambda: trio.current_time() < window_closes)
        outcome.append(caught.value)

    async with trio.open_nursery() as both:
        both.start_soon(first)
        await arrived.wait()
        both.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() < window_closes  # open while it waited
        mock_clock.jump(1.0)
        release.set()
    assert len(outcome) == 1 and seen == ["/first"]
    await http.aclose()


async def _ok_server(nursery: trio.Nursery) -> tuple[H11Server, int]:
    """A server answering 200 to everything (it never closes an idle connection)."""

    async def ok(request: Request) -> Response:
        return Response(200, b'{"ok":true}', (("content-type", "application/json"),))

    server = H11Server(ok)
    port: int = await nursery.start(server.run)
    return server, port


async def _patches_with_pauses(executor: HttpExecutor, port: int,
                               clock: trio.testing.MockClock, *,
                               requests: int, pause_s: float) -> None:
    """The client judges a pooled connection's idle time on trio's clock: the test moves
    it on instead of waiting."""
    for n in range(requests):
        answer = await executor.client.request("PATCH", f"http://127.0.0.1:{port}/{n}",
                                               content=b"{}", timeout_s=10.0)
        assert answer.status_code == 200
        clock.jump(pause_s)


async def test_sequential_exchanges_with_pauses_reuse_one_connection(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """Work arrives in claimed batches: a pooled connection often idles for seconds
    between two of its requests. It is kept for the next one, on the executor's
    client and on the receipt sender's (both BoundedHttp). Before: httpx's 5 s expiry
    closed it, and the replicas opened a TCP connection for about every third PATCH."""
    server, port = await _ok_server(nursery)
    # The simulator never closes an idle connection: declared as 120 s, kept 60 s.
    executor = HttpExecutor(BoundedHttp.open(32, {f"http://127.0.0.1:{port}":
                                                  keepalive_below(120.0)}))
    # An idle pause of 20 s between two batches.
    await _patches_with_pauses(executor, port, mock_clock, requests=6, pause_s=20.0)
    assert server.connections_accepted == 1
    await executor.aclose()


async def test_an_origin_that_declares_no_keep_alive_gets_the_safe_expiry(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """Whose idle timeout is unknown, a connection idle past SAFE_KEEPALIVE_S (below the
    5 s common servers close after) is let go: the next request opens a new one rather
    than meet a connection its server may be closing."""
    server, port = await _ok_server(nursery)
    executor = HttpExecutor()
    await _patches_with_pauses(executor, port, mock_clock, requests=3,
                               pause_s=SAFE_KEEPALIVE_S + 0.1)
    assert server.connections_accepted == 3
    await executor.aclose()
