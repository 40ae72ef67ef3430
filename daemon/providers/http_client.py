"""The one HTTP/1.1 client of provider and Runtime calls: kept-alive, bounded, never retried.

Theory of operation
-------------------
:class:`BoundedHttp` keeps, for each origin (scheme, host and port), a stack of idle
kept-alive connections, each a trio stream with its own ``h11.Connection`` (h11 speaks the
protocol: the request's framing, Content-Length and chunked answers, whether the
connection may be kept). A request takes one of ``max_connections`` slots (one request per
connection at a time), then the most recently used idle connection of its origin, or
connects a new one; asks the caller's send gate; writes the whole request in one send;
reads the answer to its end; and puts the connection back only when h11 says both sides
are done with the exchange and the connection may be kept. Anything else (an error, a
timeout, a cancellation, ``Connection: close``, an answer cut short) closes it, so a
connection is never reused half-written or half-read.

Before an idle connection is reused it is let go when it idled longer than its origin's
keep-alive expiry (always below the server's: :func:`keepalive_below`), or when its socket
is readable: an idle HTTP/1.1 connection has nothing to read unless its server closed it
(or broke the protocol). Idle connections are taken from the top of the stack and expired
from the bottom, so neither costs more than the connections it lets go. The keep-alive
clock is trio's (``trio.current_time``), so tests and the simulation move it with their
MockClock.

Timeouts: one cancel scope per request, its deadline moved on as the exchange progresses,
so the wait for a slot, the connect (a TLS handshake included), the write and each read
each get ``timeout_s`` (httpx's four timeouts, all ``timeout_s``).

Which error says what (every caller classifies these httpx exception classes):
``PoolTimeout`` (no slot in time), ``ConnectError``/``ConnectTimeout`` (no connection:
refused, DNS, TLS handshake), ``UnsupportedProtocol`` (not an http(s) URL) and
:class:`SendWindowClosed` (the gate said no) are raised before any byte of the request
left. Everything after the gate said yes (``WriteError``/``WriteTimeout``,
``ReadError``/``ReadTimeout``, ``RemoteProtocolError``: a peer that closed without a whole
answer or broke the protocol, ``LocalProtocolError``, ``DecodingError``) may have
delivered it.

No cookies are kept and no proxy or certificate settings are read from the environment;
https origins use the given TLS context. Answers are :class:`Answer` values, not httpx
models: building those per answer cost more CPU than the exchange (``bench.http_floor``).
"""

from __future__ import annotations

import collections
import json as _json
import re
import ssl
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import h11
import httpx
import trio


class SendWindowClosed(Exception):
    """The caller's send gate closed before the request's first byte: nothing left."""


# How long an idle pooled connection is kept for its next request: always well below the
# time its server keeps an idle connection open. A request sent on a connection the server
# is closing at that moment fails on the wire (``RemoteProtocolError``/``ReadError``), and
# sometimes after the server has read it and acted on it: a receipt sender then resent a
# receipt the Runtime had already committed (bench.effects: 1-4 duplicate deliveries per
# 2,000 effects with a 60 s client against the reference Runtime's 5 s; bench/keepalive_race.py
# shows the race on loopback). A close is only noticed once it has arrived.
#
# An origin that declares how long it keeps idle connections (a provider's L1 ``keep_alive``,
# a Runtime's ``[[runtimes]] keep_alive``) gets half of that; one that does not gets
# SAFE_KEEPALIVE_S, below the 5 s after which hypercorn, uvicorn, Node and Apache close an
# idle connection. Longer reuse matters: with httpx's 5 s the benchmark's replicas opened a
# TCP connection for about every third PATCH between claimed batches (316 for 1,000).
SAFE_KEEPALIVE_S = 4.0


def keepalive_below(server_keep_alive_s: float | None) -> float:
    """The idle expiry for pooled connections to a server that closes idle ones after
    ``server_keep_alive_s`` (None or 0: unknown): half of it, so the client always lets
    go first with room for a loaded scheduler and the response's own trip."""
    if not server_keep_alive_s:
        return SAFE_KEEPALIVE_S
    return server_keep_alive_s / 2


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url``: the unit of connection pooling."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class AnswerHeaders(Mapping[str, str]):
    """An answer's headers: lower-case names, a repeated header's values joined with
    ", " (as httpx's ``Headers`` reads them); looked up by name in any case."""

    __slots__ = ("_by_name",)

    def __init__(self, by_name: dict[str, str]) -> None:
        self._by_name = by_name

    def __getitem__(self, name: str) -> str:
        return self._by_name[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._by_name

    def get(self, name: str, default: Any = None) -> Any:
        return self._by_name.get(name.lower(), default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"AnswerHeaders({sorted(self._by_name)!r})"  # names only: values may be secret


@attrs.frozen
class Answer:
    """One HTTP answer, read to its end (a gzip or deflate body decoded)."""

    status_code: int
    headers: AnswerHeaders
    content: bytes

    def json(self) -> Any:
        """The body as JSON (``ValueError`` when it is not)."""
        return _json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def _header_text(value: bytes) -> str:
    try:
        return value.decode("ascii")
    except UnicodeDecodeError:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value.decode("iso-8859-1")


def _answer(status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Answer:
    """The answer callers read; a gzip or deflate body is decoded by httpx's decoders
    (``httpx.DecodingError`` when it cannot be: the request was answered, so it may well
    have been acted on)."""
    by_name: dict[str, str] = {}
    encoded = False
    for raw_name, raw_value in headers:
        name, value = raw_name.decode("ascii"), _header_text(raw_value)
        if name in by_name:
            by_name[name] = f"{by_name[name]}, {value}"
        else:
            by_name[name] = value
        encoded = encoded or name == "content-encoding"
    if encoded:
        decoded = httpx.Response(status, headers=list(headers), stream=httpx.ByteStream(body))
        decoded.read()  # in memory already: the sync path, no async generator to close
        body = decoded.content
    return Answer(status_code=status, headers=AnswerHeaders(by_name), content=body)


# A URL made only of these characters is sent as it is; any other (a space, a non-ASCII
# host or path) is normalized by httpx's URL parser first (IDNA, percent-encoding).
_PLAIN_URL = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*")

# Sent with every request unless the caller sets them. No Accept-Encoding would let a
# server pick any coding (RFC 9110 12.5.3); these are the ones :func:`_answer` decodes.
_DEFAULT_HEADERS = {"accept": "*/*", "accept-encoding": "gzip, deflate",
                    "user-agent": "integrationd"}

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _request_headers(headers: Mapping[str, str] | None, content_type: str | None,
                     length: int | None) -> dict[str, str]:
    merged = dict(_DEFAULT_HEADERS)
    if content_type is not None:
        merged["content-type"] = content_type
    for name, value in (headers or {}).items():
        merged[name.lower()] = value
    if length is not None:
        merged["content-length"] = str(length)
    merged.pop("transfer-encoding", None)  # the body is always one Content-Length chunk
    return merged


@attrs.frozen
class _Target:
    """Where a URL's request goes: its origin's pool key and parts, and the request
    target (path and query) as sent."""

    origin: str
    scheme: str
    host: str
    port: int
    target: bytes


def _target(url: str, params: Mapping[str, str] | None) -> _Target:
    if params:
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode(
            params, quote_via=urllib.parse.quote)
    parts = urllib.parse.urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc}"
    try:
        port = parts.port
    except ValueError:
        raise httpx.UnsupportedProtocol("the URL's port is not a number") from None
    if _PLAIN_URL.fullmatch(url):
        scheme, host = parts.scheme, parts.hostname or ""
        target = ((parts.path or "/") + ("?" + parts.query if parts.query else "")).encode()
    else:
        parsed = httpx.URL(url)
        scheme, host = parsed.scheme, parsed.raw_host.decode("ascii")
        port, target = parsed.port, parsed.raw_path
    if scheme not in _DEFAULT_PORTS or not host:
        raise httpx.UnsupportedProtocol("only http:// and https:// URLs with a host")
    return _Target(origin, scheme, host, port or _DEFAULT_PORTS[scheme], target)


@attrs.define(eq=False)
class _Pool:
    """One origin's idle connections, the most recently used on top."""

    scheme: str
    host: str
    port: int
    host_header: bytes
    keepalive_s: float
    idle: collections.deque[_Connection] = attrs.field(factory=collections.deque)


class _Connection:
    """One TCP (or TLS) connection and its HTTP/1.1 state."""

    __slots__ = ("h11", "idle_since", "socket", "stream")

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self.stream = stream
        self.socket = socket
        # An answer head larger than this fails as RemoteProtocolError (httpcore's bound).
        self.h11 = h11.Connection(our_role=h11.CLIENT, max_incomplete_event_size=100 * 1024)
        self.idle_since = 0.0


def _request_bytes(conn: _Connection, method: str, target: bytes,
                   headers: list[tuple[bytes, bytes]], body: bytes | None) -> bytes:
    """The whole request as h11 frames it (h11 validates the head)."""
    data = conn.h11.send(h11.Request(method=method, target=target, headers=headers)) or b""
    if body:
        data += conn.h11.send(h11.Data(data=body)) or b""
    return data + (conn.h11.send(h11.EndOfMessage()) or b"")


def _reusable(state: h11.Connection) -> bool:
    """Whether a connection may carry the next request: both sides done with this
    exchange, neither asked to close, and nothing more arrived after the answer (bytes
    nobody asked for would be read as the next request's answer)."""
    if state.our_state is not h11.DONE or state.their_state is not h11.DONE:
        return False
    unread, closed = state.trailing_data
    return not unread and not closed


# Read size: an answer of up to 64 KiB arrives in one read.
_READ_BYTES = 64 * 1024


@attrs.define(eq=False)
class BoundedHttp:
    """Per-origin pools of kept-alive HTTP/1.1 connections, at most ``max_connections``
    requests in flight in all (one per connection); see the module's docstring.

    A request over ``max_connections`` waits for a slot; a wait longer than its own
    timeout fails as ``httpx.PoolTimeout``: nothing was sent."""

    max_connections: int
    # Idle expiry of pooled connections by origin (origin_of); others SAFE_KEEPALIVE_S.
    keepalive_s: Mapping[str, float] = attrs.field(factory=dict)
    # The TLS context every https origin shares (default: certifi's trust store, as httpx's).
    tls: ssl.SSLContext = attrs.field(factory=httpx.create_ssl_context)
    _slots: trio.Semaphore = attrs.field(init=False)
    _pools: dict[str, _Pool] = attrs.field(init=False, factory=dict)
    _open: set[_Connection] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(self.max_connections)

    @classmethod
    def open(cls, max_connections: int,
             keepalive_s: Mapping[str, float] | None = None) -> BoundedHttp:
        return cls(max_connections, dict(keepalive_s or {}))

    def open_connections(self) -> int:
        """Connections open now (idle or in use)."""
        return len(self._open)

    def _pool(self, where: _Target) -> _Pool:
        pool = self._pools.get(where.origin)
        if pool is None:
            host = f"[{where.host}]" if ":" in where.host else where.host  # an IPv6 literal
            if where.port != _DEFAULT_PORTS[where.scheme]:
                host += f":{where.port}"
            pool = self._pools[where.origin] = _Pool(
                where.scheme, where.host, where.port, host.encode("ascii"),
                self.keepalive_s.get(where.origin, SAFE_KEEPALIVE_S))
        return pool

    def _close(self, conn: _Connection) -> None:
        """Close at once, without waiting (a TLS close_notify is not sent: the answer was
        read or abandoned, and nothing more goes on this connection)."""
        self._open.discard(conn)
        conn.socket.close()

    def _idle(self, pool: _Pool) -> _Connection | None:
        """The most recently used idle connection that is still fit to send on."""
        now = trio.current_time()
        idle = pool.idle
        while idle and now - idle[0].idle_since > pool.keepalive_s:
            self._close(idle.popleft())  # the oldest first: the stack is ordered by age
        while idle:
            conn = idle.pop()
            if not conn.socket.is_readable():
                return conn
            self._close(conn)  # its server closed it (or sent what nobody asked for)
        return None

    async def _connect(self, pool: _Pool) -> _Connection:
        tcp = await trio.open_tcp_stream(pool.host, pool.port)
        stream: trio.abc.Stream = tcp
        if pool.scheme == "https":
            tls = trio.SSLStream(tcp, self.tls, server_hostname=pool.host,
                                 https_compatible=True)
            try:
                await tls.do_handshake()
            except BaseException:
                tcp.socket.close()
                raise
            stream = tls
        conn = _Connection(stream, tcp.socket)
        self._open.add(conn)
        return conn

    async def request(self, method: str, url: str, *, timeout_s: float,
                      may_send: Callable[[], bool] | None = None,
                      headers: Mapping[str, str] | None = None,
                      content: bytes | None = None, json: Any = None,
                      params: Mapping[str, str] | None = None) -> Answer:
        """One exchange; ``may_send`` (if given) is asked just before the first byte
        and raises :class:`SendWindowClosed` when it says no. ``timeout_s`` bounds the
        wait for a slot, the connect, the write and each read."""
        content_type = None
        if json is not None:
            content = _json.dumps(json, ensure_ascii=False, separators=(",", ":"),
                                  allow_nan=False).encode()
            content_type = "application/json"
        where = _target(url, params)
        length = len(content) if content is not None else (
            0 if method in ("POST", "PUT", "PATCH") else None)  # Content-Length: 0, as httpx
        merged = _request_headers(headers, content_type, length)
        pool = self._pool(where)
        wire = [] if "host" in merged else [(b"host", pool.host_header)]
        wire += [(name.encode("ascii"), value.encode("ascii"))
                 for name, value in merged.items()]
        # What a timeout at each stage means; the stage moves on with the exchange.
        stage: type[httpx.TimeoutException] = httpx.PoolTimeout
        conn: _Connection | None = None
        taken = False
        scope = trio.CancelScope(deadline=trio.current_time() + timeout_s)
        try:
            with scope:
                try:
                    self._slots.acquire_nowait()
                except trio.WouldBlock:
                    await self._slots.acquire()
                    scope.deadline = trio.current_time() + timeout_s
                taken = True
                conn = self._idle(pool)
                if conn is None:
                    stage = httpx.ConnectTimeout
                    scope.deadline = trio.current_time() + timeout_s
                    try:
                        conn = await self._connect(pool)
                    except (OSError, trio.BrokenResourceError) as exc:
                        raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
                if may_send is not None and not may_send():
                    conn.idle_since = trio.current_time()
                    pool.idle.append(conn)  # untouched: nothing was written on it
                    conn = None
                    raise SendWindowClosed
                try:
                    data = _request_bytes(conn, method, where.target, wire, content)
                except h11.LocalProtocolError as exc:
                    raise httpx.LocalProtocolError(str(exc)) from exc
                stage = httpx.WriteTimeout
                written = True
                try:
                    await conn.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    # As httpcore: a server may stop reading and still answer (a 413);
                    # if it did not, the read below fails, maybe-sent either way.
                    written = False
                stage = httpx.ReadTimeout
                scope.deadline = trio.current_time() + timeout_s
                answer = await self._read(conn, scope, timeout_s)
                if written and _reusable(conn.h11):
                    conn.h11.start_next_cycle()
                    conn.idle_since = trio.current_time()
                    pool.idle.append(conn)
                    conn = None
                return answer
            raise stage(f"no progress within {timeout_s} s")
        finally:
            if conn is not None:
                self._close(conn)  # never reused half-written or half-read
            if taken:
                self._slots.release()

    @staticmethod
    async def _read(conn: _Connection, scope: trio.CancelScope, timeout_s: float) -> Answer:
        """The answer, read to its end; each read gets ``timeout_s``."""
        state = conn.h11
        head: h11.Response | None = None
        chunks: list[bytes] = []
        reads = 0
        while True:
            try:
                event = state.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc)) from exc
            if event is h11.NEED_DATA:
                if reads:  # each read its own timeout_s (the first one's was set)
                    scope.deadline = trio.current_time() + timeout_s
                reads += 1
                try:
                    data = await conn.stream.receive_some(_READ_BYTES)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise httpx.ReadError(str(exc) or type(exc).__name__) from exc
                if not data and state.their_state is h11.SEND_RESPONSE:
                    raise httpx.RemoteProtocolError(
                        "Server disconnected without sending a response.")
                state.receive_data(bytes(data))
            elif isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return _answer(head.status_code, head.headers, b"".join(chunks))
            elif isinstance(event, h11.InformationalResponse):
                continue  # a 1xx before the answer (we never ask to upgrade)
            else:  # ConnectionClosed or PAUSED before the answer ended
                raise httpx.RemoteProtocolError("the answer ended early")

    async def aclose(self) -> None:
        """Close every connection, idle or in use. No checkpoint: callers close their
        clients one after another in a ``finally`` under a cancelled scope, and a
        checkpoint here would raise Cancelled before the next client is closed."""
        for conn in list(self._open):
            self._close(conn)
        for pool in self._pools.values():
            pool.idle.clear()
