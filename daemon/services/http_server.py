"""Serve an ASGI app with hypercorn on trio; report the bound address when ready.

The listening socket is bound here, not by hypercorn, so that a port already
in use is one clear :class:`ListenerError` naming the listener and address
(hypercorn would raise a bare ``OSError`` from deep inside its nurseries). The
bound socket is handed to hypercorn as ``fd://``.

Hypercorn's own log lines (its "Running on ..." banner, connection errors) go
through a filter that gives them a stable event name and keeps the text as a
field, so no log line ever uses a server banner as its ``event``.

Every listener's app is served behind :class:`~daemon.services.http_edges.HttpEdges` (the
head-size bound, ambiguous framing, ``Connection: close`` on 408 and 413).
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

from daemon.services.http_edges import DEFAULT_MAX_HEADER_BYTES, AsgiApp, HttpEdges


class ListenerError(Exception):
    """A listener could not be opened (address in use, not permitted...): one line.

    ``listen`` is the configured address; the caller that knows which setting it
    came from names the listener (:meth:`line`)."""

    def __init__(self, listen: str, problem: str, listener: str | None = None) -> None:
        self.listen = listen
        self.problem = problem
        self.listener = listener
        super().__init__(self.line())

    def line(self, listener: str | None = None) -> str:
        return f"{listener or self.listener or 'http'} listener {self.listen}: {self.problem}"


class _HypercornEvents(logging.Filter):
    """Rewrite hypercorn's free-text records as structured ``integrationd`` events."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        fields: dict[str, object]
        if text.startswith("Running on "):
            name = "http_listening"
            fields = {"address": text.split()[2]}
        else:
            name = "http_server_error" if record.levelno >= logging.ERROR else "http_server_note"
            fields = {"detail": text[:500]}
        record.msg = name
        record.args = ()
        record.fields = fields
        return True


def _http_logger() -> logging.Logger:
    logger = logging.getLogger("integrationd.http")
    if not any(isinstance(f, _HypercornEvents) for f in logger.filters):
        logger.addFilter(_HypercornEvents())
    return logger


def bind_listener(listen: str, listener: str | None = None) -> socket.socket:
    """Bind ``listen`` (``host:port``) or raise :class:`ListenerError`."""
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (ValueError, OSError) as exc:
        raise ListenerError(listen, f"cannot resolve: {exc}", listener) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ListenerError(listen, f"port {port} is already in use", listener) from None
        raise ListenerError(listen, str(exc.strerror), listener) from None
    return sock


# How long our listeners keep an idle connection open (hypercorn's default is 5 s). Our
# clients let go of an idle connection at half of what the server declares (4 s when it
# declares nothing: daemon/providers/executor.py keepalive_below), so they never send on
# one a server is closing at that moment: such a request fails on the wire, sometimes after
# the server acted on it, and its sender resends it (duplicate receipt deliveries).
DEFAULT_KEEP_ALIVE_S = 20.0


async def serve_app(
    app: QuartTrio | Any,
    listen: str,
    *,
    name: str | None = None,
    graceful_timeout_s: float = 5.0,
    max_header_bytes: int | None = None,
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_S,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` (any ASGI app) on ``listen`` (``host:port``; port 0 picks one) until
    cancelled. ``max_header_bytes`` bounds the request line and headers.

    ``keep_alive_timeout_s`` is how long an idle kept-alive connection stays open, and
    (hypercorn runs one timer from the connection's start or its last response until a
    request's head is complete) also the most a client may take to send a head: the
    slow-loris bound. ``read_timeout`` is left unset: it bounds every read, idle waits
    included, and would close kept-alive connections sooner than this."""
    # Any ASGI app (Quart's own signature is typed apart from the plain ASGI callable).
    edges: Any = HttpEdges(cast(AsgiApp, app),
                           max_header_bytes=max_header_bytes or DEFAULT_MAX_HEADER_BYTES,
                           listener=name or "http")
    config = Config()
    config.accesslog = None
    config.errorlog = _http_logger()
    config.graceful_timeout = graceful_timeout_s
    config.include_server_header = False
    if max_header_bytes is not None:
        config.h11_max_incomplete_size = max_header_bytes
    config.keep_alive_timeout = keep_alive_timeout_s

    async def hypercorn_serve(
        *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await serve_with(edges, config, listen, name, task_status)

    async with trio.open_nursery() as nursery:
        bound: list[str] = await nursery.start(hypercorn_serve)
        task_status.started(bound[0] if bound else listen)


async def serve_bound_socket(app: Any, config: Config, listen: str, name: str | None,
                             task_status: trio.TaskStatus[list[str]]) -> None:
    """Bind ``listen`` here and let hypercorn serve it: hypercorn adopts the bound socket
    as ``fd://`` (and closes it when done)."""
    sock = bind_listener(listen, name)
    config.bind = [f"fd://{sock.detach()}"]
    await serve(app, config, task_status=task_status)


# How a configured address becomes a served listener. The deterministic simulation
# (sim/serving.py) replaces it with one that accepts on its virtual network and hands each
# stream to hypercorn's per-connection server: the ASGI apps and hypercorn's protocol code
# are the same either way.
ServeWith = Callable[[Any, Config, str, "str | None", "trio.TaskStatus[list[str]]"],
                     Awaitable[None]]
serve_with: ServeWith = serve_bound_socket
