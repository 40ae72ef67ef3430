"""The HTTP edges every listener shares (ASGI middleware, installed by ``serve_app``).

Theory of operation
-------------------
hypercorn (h11) leaves a few request edges to the application, and each listener
(ingress, ``/v1/``, the console) would otherwise meet them on its own:

* **Head size.** ``max_header_bytes`` bounds the request line and headers. hypercorn's
  ``h11_max_incomplete_size`` only bounds a head still *incomplete* in its buffer, and it
  reads 64 KiB at a time: a head of 17-60 KiB arriving at once passed a 16 KiB bound.
  Here the head as received (method, target, headers) is measured whole: over the bound
  -> 431 ``header_too_large``.
* **Ambiguous framing.** A request with both ``Content-Length`` and ``Transfer-Encoding``
  is refused with 400 ``ambiguous_length`` (RFC 9112 section 6.3: the two framings
  disagree about where the body ends, the classic request-smuggling vector; h11 would
  follow ``Transfer-Encoding`` and the application would store the body).
* **Closing says so.** A 408 (the request did not arrive in time) or a 413 (its body is
  not read) ends the connection; the answer then carries ``Connection: close``, so a
  keep-alive client knows before it sends its next request (before, hypercorn closed the
  socket without it and that request met end-of-stream). The refusals above close too.

Every refusal here has a stable reason and a sentence (``{"error", "message"}``), is
logged (``http_refused``, never a header value) and reaches no application: nothing is
read, stored or answered by it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import attrs

from daemon.services import logs

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Message, Receive, Send], Awaitable[None]]

# hypercorn's own default bound (h11_max_incomplete_size), for listeners that set none.
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
# Answers after which the connection cannot be reused (the request was not read whole).
CLOSING_STATUSES = frozenset({408, 413})


def head_bytes(scope: Message) -> int:
    """The request line and headers as they were sent (``NAME: value\\r\\n`` each)."""
    target = len(scope.get("raw_path") or scope.get("path", "").encode())
    query = scope.get("query_string", b"")
    line = len(scope.get("method", "")) + 1 + target + (1 + len(query) if query else 0) + 11
    return line + sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ())) + 2


def _has(scope: Message, name: bytes) -> bool:
    return any(k.lower() == name for k, _ in scope.get("headers", ()))


@attrs.define(eq=False)
class HttpEdges:
    app: AsgiApp
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    listener: str = "http"

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        size = head_bytes(scope)
        if size > self.max_header_bytes:
            await self._refuse(send, 431, "header_too_large",
                               f"the request line and headers take {size} bytes (at most"
                               f" {self.max_header_bytes})")
            return
        if _has(scope, b"content-length") and _has(scope, b"transfer-encoding"):
            await self._refuse(send, 400, "ambiguous_length",
                               "a request may not carry both Content-Length and"
                               " Transfer-Encoding (RFC 9112 section 6.3)")
            return

        async def closing(message: Message) -> None:
            if (message["type"] == "http.response.start"
                    and message.get("status") in CLOSING_STATUSES):
                message = _with_close(message)
            await send(message)

        await self.app(scope, receive, closing)

    async def _refuse(self, send: Send, status: int, reason: str, sentence: str) -> None:
        logs.warn("http_refused", listener=self.listener, status=status, reason=reason)
        body = (b'{"error":"' + reason.encode() + b'","message":"' + sentence.encode()
                + b'"}')
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _with_close(message: Message) -> Message:
    headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
    return {**message, "headers": [*headers, (b"connection", b"close")]}
