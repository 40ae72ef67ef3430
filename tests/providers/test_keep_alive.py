"""Our clients let go of an idle connection before our servers close it.

A request sent on a kept-alive connection just as its server closes it for idleness fails
on the wire, sometimes after the server read it and acted on it; the receipt sender then
sent the receipt again (bench.effects: 1-4 duplicate deliveries per 2,000 effects with
clients keeping connections 60 s and the reference Runtime's server closing them after
hypercorn's 5 s; ``python -m bench.keepalive_race`` shows the race on loopback).

Real servers on loopback; the server's idle timer and the client's keep-alive expiry both
run on trio's clock (MockClock), so a connection idles past the server's keep-alive
without the test waiting."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from config.load import ConfigError, parse_settings
from daemon.providers.executor import SAFE_KEEPALIVE_S, BoundedHttp, keepalive_below
from daemon.services.families import known_family_names
from daemon.services.http_server import DEFAULT_KEEP_ALIVE_S, serve_app

HYPERCORN_DEFAULT_KEEP_ALIVE_S = 5.0


class _Counting:
    """An ASGI app answering 200 and noting each request's path and client port."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        self.seen.append((scope["path"], scope["client"][1]))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


async def test_a_request_after_an_idle_pause_goes_out_on_a_fresh_connection(
        nursery: trio.Nursery, mock_clock: trio.testing.MockClock) -> None:
    """Idle just past the server's keep-alive, the client sends before the server's idle
    timer has run: the pool has already let the connection go (it keeps one half the
    server's keep-alive), so the request goes out on a new connection and is answered,
    and the server sees each request once. Before (clients kept connections 60 s, the
    server 5 s): every request went out on the one connection whose server's idle timer
    had fired (``assert 1 == 4``); here trio happened to read the request before the
    timer closed it, on a loaded replica it often did not, and the request failed on the
    wire after the server acted on it (``python -m bench.keepalive_race``)."""
    app = _Counting()
    url: str = await nursery.start(serve_app, app, "127.0.0.1:0")
    http = BoundedHttp.open(4, {url: keepalive_below(DEFAULT_KEEP_ALIVE_S)})
    for n in range(3):
        answer = await http.request("POST", f"{url}/r{n}", content=b"x", timeout_s=10.0)
        assert answer.status_code == 200
        pause = DEFAULT_KEEP_ALIVE_S + 0.01
        mock_clock.jump(pause)  # the server's idle timer is due, and has not run yet
    answer = await http.request("POST", f"{url}/last", content=b"x", timeout_s=10.0)
    assert answer.status_code == 200
    assert [path for path, _ in app.seen] == ["/r0", "/r1", "/r2", "/last"]
    assert len({port for _, port in app.seen}) == 4  # a fresh connection after each pause
    await http.aclose()


async def test_within_the_clients_expiry_one_connection_serves_every_request(
        nursery: trio.Nursery, mock_clock: trio.testing.MockClock) -> None:
    """The expiry does not give up reuse: pauses shorter than the client's expiry (half
    the server's keep-alive) keep one connection."""
    app = _Counting()
    url: str = await nursery.start(serve_app, app, "127.0.0.1:0")
    http = BoundedHttp.open(4, {url: keepalive_below(DEFAULT_KEEP_ALIVE_S)})
    for n in range(4):
        answer = await http.request("POST", f"{url}/r{n}", content=b"x", timeout_s=10.0)
        assert answer.status_code == 200
        pause = keepalive_below(DEFAULT_KEEP_ALIVE_S) - 1.0
        mock_clock.jump(pause)
    assert len({port for _, port in app.seen}) == 1
    await http.aclose()


def test_our_servers_keep_idle_connections_longer_than_our_clients() -> None:
    """Each side of each exchange: a client's expiry for a server that declares its
    keep-alive is half of it; for one that declares none it is below the 5 s after which
    hypercorn (and uvicorn, Node, Apache) close; our listeners keep 20 s."""
    assert keepalive_below(DEFAULT_KEEP_ALIVE_S) == DEFAULT_KEEP_ALIVE_S / 2
    assert keepalive_below(None) == SAFE_KEEPALIVE_S < HYPERCORN_DEFAULT_KEEP_ALIVE_S
    assert DEFAULT_KEEP_ALIVE_S > 2 * SAFE_KEEPALIVE_S


@pytest.mark.parametrize(("raw", "key"), [
    ({"api": {"keep_alive": 0.5}}, "api.keep_alive"),
    ({"api": {"keep_alive": 600}}, "api.keep_alive"),
    ({"admin": {"keep_alive": 121}}, "admin.keep_alive"),
])
def test_a_listeners_keep_alive_is_bounded(raw: dict[str, Any], key: str) -> None:
    """A listener's keep-alive is also the slow-loris bound (hypercorn's one timer for an
    idle connection and for a request's head): 1 to 120 s, else a one-line error."""
    with pytest.raises(ConfigError) as refused:
        parse_settings(raw, environ={}, known_families=known_family_names())
    assert refused.value.key == key
