"""A raw HTTP/1.1 client on one TCP socket, for tests of what happens between requests.

An ordinary client (httpx) hides the connection: it reads a whole response,
then decides on its own whether to reuse the socket. The early-refusal tests
need to do what a client that sends its body after the server has answered
does: send the headers, read the answer, then send the body and a second
request on the same socket, and see whether that request is answered or the
socket is closed. :func:`read_response` parses just enough HTTP/1.1 for that
(status line, headers, a ``Content-Length`` body).
"""

from __future__ import annotations

import attrs
import trio

MAX_HEAD = 64 * 1024
LATE_BODY_S = 0.1


@attrs.frozen
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


class ConnectionClosed(Exception):
    """The server closed the socket (cleanly) before a whole response arrived."""


@attrs.define(eq=False)
class RawConnection:
    stream: trio.SocketStream
    buffer: bytearray = attrs.field(factory=bytearray)

    @classmethod
    async def open(cls, address: str) -> RawConnection:
        """Connect to ``http://host:port`` (what ``serve_app`` reports)."""
        host, _, port = address.removeprefix("http://").rpartition(":")
        return cls(await trio.open_tcp_stream(host, int(port)))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> None:
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:  # a reset: closed too, if less politely
            data = b""
        if not data:
            raise ConnectionClosed(f"closed with {len(self.buffer)} bytes unread")
        self.buffer.extend(data)

    async def read_response(self) -> RawResponse:
        """One whole response, or :class:`ConnectionClosed` if the server closes first."""
        while b"\r\n\r\n" not in self.buffer:
            if len(self.buffer) > MAX_HEAD:
                raise AssertionError("response head too large")
            await self._fill()
        head, _, rest = bytes(self.buffer).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        self.buffer[:] = rest
        while len(self.buffer) < length:
            await self._fill()
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return RawResponse(status, headers, body)

    async def is_closed(self) -> bool:
        """Whether the server has closed the socket (reads EOF), given nothing is pending."""
        try:
            await self._fill()
        except ConnectionClosed:
            return True
        return False

    async def aclose(self) -> None:
        await self.stream.aclose()


def request_head(method: str, path: str, headers: dict[str, str], body_length: int) -> bytes:
    """An HTTP/1.1 request head announcing a ``body_length`` byte body."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {body_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def refused_then_next(address: str, method: str, path: str, headers: dict[str, str],
                            body: bytes, then: str, then_headers: dict[str, str] | None = None,
                            *, timeout_s: float = 5.0) -> tuple[RawResponse, RawResponse | None]:
    """Send a request's head, read the (early) answer, then send its body and a GET of
    ``then`` on the same socket.

    Returns the first answer and the GET's answer, or ``None`` when the server
    closed the socket instead (which is a clean answer too). A server that does
    neither within ``timeout_s`` fails the test (``trio.TooSlowError``): the
    stall this guards against.
    """
    conn = await RawConnection.open(address)
    try:
        with trio.fail_after(timeout_s):
            await conn.send(request_head(method, path, headers, len(body)))
            first = await conn.read_response()
            # Let the server finish the answer before the body arrives: the late body of
            # the finding (sent at once, it often races the end of the answer and wins).
            await trio.sleep(LATE_BODY_S)
            try:
                # Two writes, as a client sends a body and later its next request.
                await conn.send(body)
                await conn.send(request_head("GET", then, then_headers or {}, 0))
            except trio.BrokenResourceError:
                return first, None
            try:
                second = await conn.read_response()
            except ConnectionClosed:
                return first, None
            return first, second
    finally:
        await conn.aclose()
