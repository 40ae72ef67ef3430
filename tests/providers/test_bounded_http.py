"""BoundedHttp: one request per pooled connection; a wait past the timeout sends nothing."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from daemon.providers.executor import SHARD_CONNECTIONS, BoundedHttp
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
    first: list[httpx.Response] = []

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

    servers = [H11Server(ok) for _ in range(SHARD_CONNECTIONS + 1)]
    ports = [await nursery.start(server.run) for server in servers]
    http = BoundedHttp.open(SHARD_CONNECTIONS)
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
