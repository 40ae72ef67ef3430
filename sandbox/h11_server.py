"""A small HTTP/1.1 server on trio sockets and h11, for the sandbox simulators.

Theory of operation
-------------------
One trio task per TCP connection drives an ``h11.Connection`` (the protocol is
h11's state machine; this module only moves bytes). For each request the task
reads the *whole* request, head and body, builds a frozen :class:`Request` and
awaits the handler, which returns either a :class:`Response` or :data:`ABORT`.

``ABORT`` is the reason this module exists instead of an ASGI server: the
connection is closed with ``SO_LINGER = (1, 0)``, so the kernel sends a TCP RST
and the client sees a reset with no response bytes at all. That is how the
simulators produce "the request reached the provider, the answer never came".

Keep-alive is h11's: after a response the connection starts its next cycle
unless either side asked to close. Bodies larger than ``max_body`` are not kept:
the server keeps reading and discarding them (up to ``drain_limit``) so the
client can read a clean 413 on a connection that is still usable, and the
handler sees ``body_too_large=True``. Past ``drain_limit`` the server stops
reading, answers with ``Connection: close`` and closes without waiting for the
rest of the body.

Handler exceptions become a 500 and are logged once; they never take the
listener down. Per-request work is deliberately small: no per-request logging,
one ``send_all`` per response.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import attrs
import h11
import trio

_log = logging.getLogger("integrationd.sandbox.http")

_RECEIVE_SIZE: Final = 65536
# SO_LINGER with l_onoff=1, l_linger=0: close() discards unsent data and sends RST.
_LINGER_RST: Final = struct.pack("ii", 1, 0)
# How long a closing connection may take to drain what the client still sends, so
# the close does not turn into an RST that would destroy the response in flight.
_LINGERING_CLOSE_S: Final = 1.0


@attrs.frozen
class Request:
    """One complete HTTP request as the handler sees it."""

    method: str
    target: str  # raw request target: path plus optional "?query"
    path: str
    query: str
    headers: Mapping[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes  # empty when body_too_large
    body_too_large: bool = False


@attrs.frozen
class Response:
    """What the handler wants sent back. ``headers`` must not include Content-Length."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Abort:
    """Handler verdict: reset the TCP connection instead of responding."""


ABORT: Final = Abort()

Handler = Callable[[Request], Awaitable[Response | Abort]]


def reset_connection(stream: trio.SocketStream) -> None:
    """Close ``stream`` so the peer sees a TCP RST rather than a FIN."""
    with contextlib.suppress(OSError):  # already dead: closing is all that is left to do
        stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    stream.socket.close()


@attrs.define(eq=False)
class H11Server:
    """Serve ``handler`` over HTTP/1.1 until cancelled.

    ``connections_accepted`` counts TCP connections, so tests can tell keep-alive
    (many requests, one connection) from reconnecting clients.
    """

    handler: Handler
    max_body: int = 64 * 1024
    drain_limit: int = 4 * 1024 * 1024
    connections_accepted: int = attrs.field(default=0, init=False)
    open_connections: int = attrs.field(default=0, init=False)

    async def run(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (0 picks a free port); report the bound port when ready."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound: int = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            # serve_listeners closes the listeners (and, through this nursery, every
            # connection task) when the surrounding scope is cancelled.
            await nursery.start(trio.serve_listeners, self._serve_connection, listeners)
            task_status.started(bound)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        self.connections_accepted += 1
        self.open_connections += 1
        try:
            await _Connection(self, stream).serve()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away; nothing to report
        except Exception:
            # A bug in this module or h11 misuse: lose this connection, keep the server.
            _log.exception("sandbox_http_connection_failed")
            reset_connection(stream)
        finally:
            self.open_connections -= 1
            # Synchronous close: safe even while being cancelled, never leaks the fd.
            stream.socket.close()


@attrs.define(eq=False)
class _Connection:
    server: H11Server
    stream: trio.SocketStream
    conn: h11.Connection = attrs.field(factory=lambda: h11.Connection(h11.SERVER))

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            data = await self.stream.receive_some(_RECEIVE_SIZE)
            self.conn.receive_data(data)  # b"" marks EOF; h11 turns it into ConnectionClosed

    async def serve(self) -> None:
        while True:
            try:
                event = await self._next_event()
                if not isinstance(event, h11.Request):
                    # ConnectionClosed (client done) or anything unexpected: stop here.
                    return
                request, complete = await self._read_request(event)
            except h11.RemoteProtocolError as exc:
                await self._reject(exc.error_status_hint)
                return
            try:
                verdict = await self.server.handler(request)
            except Exception:
                _log.exception("sandbox_http_handler_failed")
                verdict = Response(500, b'{"status":"error","message":"simulator bug"}',
                                   (("content-type", "application/json"),))
            if isinstance(verdict, Abort):
                reset_connection(self.stream)
                return
            must_close = not complete
            await self._send(verdict, close=must_close, head=request.method == "HEAD")
            if must_close or self.conn.our_state is h11.MUST_CLOSE:
                await self._lingering_close()
                return
            self.conn.start_next_cycle()

    async def _read_request(self, head: h11.Request) -> tuple[Request, bool]:
        """Read the body; return the request and whether the body was read to its end."""
        target = head.target.decode("latin-1")
        path, _, query = target.partition("?")
        headers: dict[str, str] = {}
        for raw_name, raw_value in head.headers:
            name = raw_name.decode("latin-1")  # h11 already lower-cases names
            value = raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if self.conn.they_are_waiting_for_100_continue:
            # Clients such as curl hold large bodies back until told to go on.
            await self.stream.send_all(
                self.conn.send(h11.InformationalResponse(status_code=100, headers=[]))
            )
        chunks: list[bytes] = []
        size = 0
        too_large = False
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.server.max_body:
                    too_large = True
                    chunks.clear()  # never hold more than max_body of a rejected body
                    if size > self.server.drain_limit:
                        break
                else:
                    chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                break
            else:  # a guard only: h11 reports EOF mid-body as RemoteProtocolError
                raise trio.BrokenResourceError("connection closed mid-request")
        request = Request(
            method=head.method.decode("ascii"),
            target=target,
            path=path,
            query=query,
            headers=headers,
            body=b"" if too_large else b"".join(chunks),
            body_too_large=too_large,
        )
        return request, not (too_large and size > self.server.drain_limit)

    async def _send(self, response: Response, *, close: bool, head: bool = False) -> None:
        headers = [(name.encode("latin-1"), value.encode("latin-1"))
                   for name, value in response.headers]
        headers.append((b"content-length", str(len(response.body)).encode("ascii")))
        if close:
            headers.append((b"connection", b"close"))
        data = self.conn.send(h11.Response(status_code=response.status, headers=headers))
        if response.body and not head:  # a HEAD response declares the length, sends no body
            data += self.conn.send(h11.Data(data=response.body))
        data += self.conn.send(h11.EndOfMessage())
        await self.stream.send_all(data)

    async def _reject(self, status: int) -> None:
        """Answer a request h11 could not parse, if the protocol still allows an answer."""
        # h11 leaves our side untouched by the client's error, and lets a server
        # answer from IDLE precisely so that a malformed head can get its 400.
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = b'{"status":"error","category":"BAD_REQUEST","message":"malformed HTTP"}'
            await self._send(Response(status, body, (("content-type", "application/json"),)),
                             close=True)
        await self._lingering_close()

    async def _lingering_close(self) -> None:
        """Half-close, then drain briefly: closing with unread input would send an RST."""
        try:
            await self.stream.send_eof()
            with trio.move_on_after(_LINGERING_CLOSE_S):
                while await self.stream.receive_some(_RECEIVE_SIZE):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
