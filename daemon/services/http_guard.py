"""Early refusals that leave a kept-alive HTTP/1.1 connection usable (ASGI middleware).

Theory of operation
-------------------
A handler may answer before it has read the request body: 401 before looking
at a body it will not accept, 403 for a missing CSRF token, 415 for a content
type it does not parse. Under hypercorn (0.18) + quart-trio that used to hang
the connection whenever the body arrived *after* the answer: the server saw
the response end while the client was still sending, tried to close the
connection from inside the application's task, and that close was cancelled
by quart-trio as it tore the request down, so the socket stayed open with the
HTTP state machine stuck mid-request; the next request on it was never
answered (ordinary clients stalled until their timeout).

:class:`EarlyRefusalGuard` wraps an ASGI app and, for any response that starts
before the request body has been received in full:

* when the rest of the body is within ``max_drain_bytes`` (the app's own body
  limit) and the response has a ``Content-Length``: sends the response's bytes
  at once, then holds back only the end-of-response event until the body has
  arrived (Quart keeps reading it into its bounded buffer, which is dropped with
  the request) or ``drain_timeout_s`` has passed, so the connection is reused
  cleanly; a client that never sends its body loses the connection after the
  timeout, never the answer;
* otherwise (a declared body over the bound, no response length, a 408 or a 413):
  answers with ``Connection: close``, and the server closes the connection after the
  answer.

In both cases the final send runs shielded from the request's teardown, so the
server's own bookkeeping (reuse or close) always completes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import attrs
import trio

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Message, Receive, Send], Awaitable[None]]

DRAIN_TIMEOUT_S = 5.0


def _header(scope: Message, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value)
    return None


def _declared_length(scope: Message) -> int | None:
    value = _header(scope, b"content-length")
    if value is None:
        return None
    try:
        return max(0, int(value))
    except ValueError:
        return None


@attrs.define(eq=False)
class _Exchange:
    """One request/response: what of the body has arrived, and how to end the response."""

    receive_from: Receive
    send_to: Send
    max_drain_bytes: int
    drain_timeout_s: float
    declared: int | None
    chunked: bool
    received: int = 0
    settled: trio.Event = attrs.field(factory=trio.Event)  # body complete, too big, or gone
    complete: bool = False
    drain: bool = False

    async def receive(self) -> Message:
        message = await self.receive_from()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.complete = True
                self.settled.set()
            elif self.received > self.max_drain_bytes:
                self.settled.set()
        elif message["type"] == "http.disconnect":
            self.settled.set()
        return message

    def body_pending(self) -> bool:
        return not self.complete and (self.chunked or bool(self.declared))

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and self.body_pending():
            headers = list(message.get("headers", ()))
            has_length = any(k.lower() == b"content-length" for k, _ in headers)
            within = self.declared is None or self.declared <= self.max_drain_bytes
            # A 408 (the body is late) or 413 (it is too large) is never drained: waiting
            # for that body is what the answer refuses. The connection closes, saying so.
            closing = message.get("status") in (408, 413)
            self.drain = has_length and within and not closing
            if not self.drain:
                headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
        elif kind == "http.response.body" and not message.get("more_body", False):
            if self.drain and self.body_pending():
                await self.send_to({**message, "more_body": True})
                with trio.move_on_after(self.drain_timeout_s):
                    await self.settled.wait()
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            with trio.CancelScope(shield=True):
                await self.send_to(message)
            return
        await self.send_to(message)


@attrs.define(eq=False)
class EarlyRefusalGuard:
    """Wrap ``app`` so that answering before the body is read never stalls the connection."""

    app: AsgiApp
    max_drain_bytes: int
    drain_timeout_s: float = DRAIN_TIMEOUT_S

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = _Exchange(
            receive_from=receive, send_to=send, max_drain_bytes=self.max_drain_bytes,
            drain_timeout_s=self.drain_timeout_s, declared=_declared_length(scope),
            chunked=_header(scope, b"transfer-encoding") is not None,
        )
        await self.app(scope, exchange.receive, exchange.send)


def guard_app(app: Any, max_drain_bytes: int) -> None:
    """Install the guard on a Quart app (``app.asgi_app``), draining up to its body limit."""
    app.asgi_app = EarlyRefusalGuard(app.asgi_app, max_drain_bytes)
