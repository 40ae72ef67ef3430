"""The provider-neutral HTTP executor, driven by L1 operation definitions.

Theory of operation
-------------------
:func:`prepare` turns (operation definition, binding, remote id, frozen
request) into the exact bytes to send, by the definition's request template
(``daemon/providers/template.py``): the field map is taken from the command
where the definition says (``command_fields``) and checked against its
allowed fields, then the body template, path template, content type and
idempotency header are filled in. :meth:`HttpExecutor.dispatch` performs
*one* exchange and reports a :class:`DispatchObservation` of how far it got;
it never retries (httpcore does not retry requests, and its pools are built
with ``retries=0``). :meth:`HttpExecutor.read` performs the definition's
read-back for reconciliation.

Which exceptions mean "nothing was sent": failing to connect (refused, DNS,
connect timeout), waiting for a pooled connection, and a caller's *send gate*
that closed. The last two are our own side holding the request back
(``Phase.HELD``: contention, never a failed attempt); the first is
``NOT_CONNECTED``. Anything after that (write/read errors and timeouts, a peer
that closes without answering) may have delivered the request, so it is ``SENT``.

A send gate is asked at the last moment before the first byte leaves (httpcore's
``send_request_headers.started`` trace event, on a connection already taken): a
quota slot is a time window, and the wait for a connection, the connect and the
event loop's own lag all come after the runner's last check of it. A gate that
says no raises :class:`SendWindowClosed` there; the connection is closed, never
reused half-written, and the exchange is ``NOT_CONNECTED``.

Credentials are added at dispatch only, as the definition's auth scheme says
(header and prefix); the prepared request keeps the headers that are safe to
store (everything except the credential). The response's evidence headers and
fields, and where it names the record it changed (checked against the pinned
remote id by :func:`daemon.core.effects.classify`), come from the definition
too; so do the read-back's pointers and its "absent" statuses. No provider
name appears here.
"""

from __future__ import annotations

import datetime
import hashlib
import http.cookiejar
import json as _json
import re
import ssl
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import httpcore
import httpx
import trio

from config.definitions import (
    AuthScheme,
    OperationDefinition,
    ReadDefinition,
    ResponseDefinition,
)
from config.settings import BindingSettings
from daemon.core.canonical import canonical_bytes
from daemon.core.effects import (
    CONNECTION_WAIT,
    SLOT_EXPIRED,
    DispatchObservation,
    IdentityEvidence,
    Phase,
    RemoteSnapshot,
)
from daemon.core.exchange_excerpt import excerpt_of
from daemon.providers.template import RenderError, field_map, identity_text


class BadRequestForOperation(ValueError):
    """The frozen request does not fit the operation definition (never dispatched)."""


@attrs.frozen(kw_only=True)
class PreparedRequest:
    method: str
    url: str
    path: str
    body: bytes
    safe_headers: dict[str, str]
    body_sha256: str
    idempotency_key: str
    desired: dict[str, str | None]
    # The pinned remote id the request targets, and how its response is read.
    remote_id: str
    auth: AuthScheme
    response: ResponseDefinition
    # The response headers the provider's quota dimensions name (its remaining count,
    # when its window resets).
    quota_headers: tuple[str, ...] = ()
    # The header that carries ``idempotency_key`` ("": none is sent). Every observation
    # of this request names it: a replay proof holds only for a request that carried it.
    idempotency_header: str = ""


def desired_fields(operation: OperationDefinition, request: Any) -> dict[str, str | None]:
    """The field map a frozen command request asks for, where the definition says it is."""
    where = "request" + operation.command_fields.label
    try:
        return field_map(operation.command_fields.find(request), where,
                         operation.allowed_fields)
    except RenderError as exc:
        raise BadRequestForOperation(f"{operation.name}: {exc}") from None


def prepare(
    operation: OperationDefinition,
    binding: BindingSettings,
    remote_id: str,
    request: Mapping[str, Any],
    idempotency_key: str,
) -> PreparedRequest:
    """The exact request the definition's template makes for this command."""
    fields = desired_fields(operation, request)
    template = operation.request
    try:
        doc = template.body.render(fields=fields, remote_id=remote_id)
    except RenderError as exc:
        raise BadRequestForOperation(f"{operation.name}: {exc}") from None
    path = template.path.render(remote_id=remote_id)
    body = canonical_bytes(doc)
    headers = {"Content-Type": template.content_type}
    if template.idempotency_header:
        headers[template.idempotency_header] = idempotency_key
    return PreparedRequest(
        method=template.method,
        url=binding.base_url.rstrip("/") + path,
        path=path,
        body=body,
        safe_headers=headers,
        body_sha256="sha256:" + hashlib.sha256(body).hexdigest(),
        idempotency_key=idempotency_key,
        desired=fields,
        remote_id=remote_id,
        auth=template.auth,
        response=operation.response,
        quota_headers=tuple(sorted({h for q in operation.quotas
                                    for h in (q.remaining_header, q.reset_header) if h})),
        idempotency_header=template.idempotency_header,
    )


def _credential(auth: AuthScheme, token: str) -> dict[str, str]:
    return {auth.header: auth.prefix + token}


def _evidence_value(value: Any) -> str | None:
    text = identity_text(value)
    return None if text is None else text[:128]


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP-date: fall back to the contract's default


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (None: absent, or an HTTP-date)."""
    return _retry_after(value)


def _parse_time_us(text: object) -> int | None:
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1_000_000)


# The provider evidence key of the changed record's new last-modified time (epoch us),
# from L1's ``response.updated_at``.
MODIFIED_AT = "modified_at_us"


class SendWindowClosed(Exception):
    """The caller's send gate closed before the request's first byte: nothing left."""


# The detail a closed send gate reports (the runner's own late check reports the same).
SEND_WINDOW_CLOSED = SLOT_EXPIRED


def _gated(may_send: Callable[[], bool]) -> Callable[[str, dict[str, Any]], Any]:
    """An httpcore trace hook that asks ``may_send`` as the request headers start."""

    async def hook(event: str, info: dict[str, Any]) -> None:
        if event.endswith(".send_request_headers.started") and not may_send():
            raise SendWindowClosed

    return hook


_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol,
             SendWindowClosed)
# What a caller outside the executor treats as "provably never sent" (quota give-back).
NOT_SENT = _NOT_SENT


class NoCookies(http.cookiejar.CookieJar):
    """A cookie jar that keeps nothing. One client serves every principal of an origin,
    and integrationd authenticates each request itself: a cookie one binding's answer
    set must never ride on another binding's request. (It also spares every answer the
    jar's Set-Cookie parsing.)"""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def set_cookie(self, cookie: http.cookiejar.Cookie) -> None:
        return None


# How long an idle pooled connection is kept for its next request: always well below the
# time its server keeps an idle connection open. A request sent on a connection the server
# is closing at that moment fails on the wire (``RemoteProtocolError``/``ReadError``), and
# sometimes after the server has read it and acted on it: a receipt sender then resent a
# receipt the Runtime had already committed (bench.effects: 1-4 duplicate deliveries per
# 2,000 effects with a 60 s client against the reference Runtime's 5 s; bench/keepalive_race.py
# shows the race on loopback). httpcore only notices a close that has already arrived.
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


def new_http_client(max_connections: int, tls: ssl.SSLContext | None = None, *,
                    keepalive_s: float = SAFE_KEEPALIVE_S) -> httpcore.AsyncConnectionPool:
    """An HTTP/1.1 connection pool with keep-alive and no retries of any kind.

    ``tls`` lets many pools share one context: each default context loads the CA bundle
    again (time and ~0.7 MB apiece). ``keepalive_s``: how long an idle connection is
    kept (see :func:`keepalive_below`). httpcore keeps no cookies and reads no proxy or
    certificate settings from the environment.
    """
    return httpcore.AsyncConnectionPool(
        ssl_context=tls or httpx.create_ssl_context(),
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=keepalive_s,
        http1=True, http2=False, retries=0,
    )


# Connections per pool. httpcore's pool does work proportional to its size on every
# request: one pool's CPU per exchange was 550 us with 4 connections and 1,270 us with 32
# (``python -m bench.http_floor``, through httpx), so many connections are many small pools.
SHARD_CONNECTIONS = 4

# httpcore's exceptions as the httpx ones every caller classifies (the same mapping httpx
# itself applies; by name, most specific first along each class's MRO). httpcore raises a
# ConnectError/ConnectTimeout only before the request's first byte, and the pool's wait as
# PoolTimeout; everything else (write, read, protocol errors) may have delivered it.
_HTTPX_ERROR: dict[type[Exception], type[httpx.HTTPError]] = {
    httpcore.ConnectTimeout: httpx.ConnectTimeout,
    httpcore.ReadTimeout: httpx.ReadTimeout,
    httpcore.WriteTimeout: httpx.WriteTimeout,
    httpcore.PoolTimeout: httpx.PoolTimeout,
    httpcore.TimeoutException: httpx.TimeoutException,
    httpcore.ConnectError: httpx.ConnectError,
    httpcore.ReadError: httpx.ReadError,
    httpcore.WriteError: httpx.WriteError,
    httpcore.NetworkError: httpx.NetworkError,
    httpcore.RemoteProtocolError: httpx.RemoteProtocolError,
    httpcore.LocalProtocolError: httpx.LocalProtocolError,
    httpcore.ProtocolError: httpx.ProtocolError,
    httpcore.UnsupportedProtocol: httpx.UnsupportedProtocol,
    httpcore.ProxyError: httpx.ProxyError,
}
_HTTPCORE_ERRORS = tuple(_HTTPX_ERROR)


def _as_httpx(exc: Exception) -> httpx.HTTPError:
    for kind in type(exc).__mro__:
        mapped = _HTTPX_ERROR.get(kind)
        if mapped is not None:
            return mapped(str(exc))
    return httpx.TransportError(str(exc))  # an httpcore error this table does not name


# A URL made only of these characters goes to httpcore as it is; any other (a space, a
# non-ASCII host or path) is normalized by httpx's URL parser first (IDNA, percent-encoding).
_PLAIN_URL = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*")

# Sent with every request unless the caller sets them. No Accept-Encoding would let a
# server pick any coding (RFC 9110 12.5.3); these are the ones :func:`_answer` decodes.
_DEFAULT_HEADERS = {"accept": "*/*", "accept-encoding": "gzip, deflate",
                    "user-agent": "integrationd"}


def _url(url: str, params: Mapping[str, str] | None) -> httpcore.URL:
    if params:
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode(
            params, quote_via=urllib.parse.quote)
    if _PLAIN_URL.fullmatch(url):
        return httpcore.URL(url)
    parsed = httpx.URL(url)
    return httpcore.URL(scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port,
                        target=parsed.raw_path)


def _request_headers(headers: Mapping[str, str] | None, content_type: str | None,
                     length: int | None) -> list[tuple[bytes, bytes]]:
    merged = dict(_DEFAULT_HEADERS)
    if content_type is not None:
        merged["content-type"] = content_type
    for name, value in (headers or {}).items():
        merged[name.lower()] = value
    if length is not None:
        merged["content-length"] = str(length)
    merged.pop("transfer-encoding", None)
    return [(name.encode("ascii"), value.encode("ascii")) for name, value in merged.items()]


class _Body:
    """A request body of one chunk, as an async iterator that is not an async generator.

    httpcore wraps ``bytes`` content in an async generator; when a write fails or times
    out part-way, that generator is left unexhausted and trio warns as the garbage
    collector takes it. This one holds nothing to finalize. Its length goes in the
    Content-Length header (:func:`_request_headers`), never chunked."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        if self._data is None:
            raise StopAsyncIteration
        data, self._data = self._data, None
        return data


def _answer(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> httpx.Response:
    """The pool's answer as the ``httpx.Response`` callers read (its status, headers,
    content, ``json()``); a gzip or deflate body is decoded (``httpx.DecodingError`` when
    it cannot be: the request was answered, so it may well have been acted on)."""
    if not any(name.lower() == b"content-encoding" for name, _ in headers):
        return httpx.Response(status, headers=headers, content=body)
    response = httpx.Response(status, headers=headers, stream=httpx.ByteStream(body))
    response.read()  # in memory already: the sync path, no async generator to close
    return response


@attrs.define(eq=False)
class _Shard:
    pool: httpcore.AsyncConnectionPool
    busy: int = 0


@attrs.define(eq=False)
class BoundedHttp:
    """httpcore connection pools that admit one request per pooled connection at a time.

    Each origin (scheme and host:port) gets its own small pools of
    ``SHARD_CONNECTIONS`` connections, made as its load needs them, so a
    pool never closes a kept-alive connection to one origin to open one to
    another, and stays small. A request goes to the least busy pool of its
    origin. Requests over ``max_connections`` in all wait on a semaphore
    instead of in httpcore's queue; a wait longer than the request's own
    timeout fails as ``httpx.PoolTimeout``: nothing was sent.

    httpcore directly, not httpx's client: the client's request and response
    models, auth and cookie flows and header normalization cost more CPU than
    the exchange itself (``python -m bench.http_floor``). Errors are raised as
    the httpx exceptions httpx maps httpcore's to, so every caller's "never
    sent" / "maybe sent" classification is unchanged; answers are
    ``httpx.Response`` values.
    """

    max_connections: int
    # Idle expiry of pooled connections by origin (origin_of); others SAFE_KEEPALIVE_S.
    keepalive_s: Mapping[str, float] = attrs.field(factory=dict)
    # The TLS context every pool shares (default: certifi's trust store, as httpx's).
    tls: ssl.SSLContext = attrs.field(factory=httpx.create_ssl_context)
    _slots: trio.Semaphore = attrs.field(init=False)
    _origins: dict[str, list[_Shard]] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(self.max_connections)

    @classmethod
    def open(cls, max_connections: int,
             keepalive_s: Mapping[str, float] | None = None) -> BoundedHttp:
        return cls(max_connections, dict(keepalive_s or {}))

    def _shard(self, url: str) -> _Shard:
        origin = origin_of(url)
        shards = self._origins.setdefault(origin, [])
        shard = min(shards, key=lambda s: s.busy, default=None)
        if shard is None or shard.busy >= SHARD_CONNECTIONS:
            shard = _Shard(new_http_client(
                SHARD_CONNECTIONS, self.tls,
                keepalive_s=self.keepalive_s.get(origin, SAFE_KEEPALIVE_S)))
            shards.append(shard)
        return shard

    async def request(self, method: str, url: str, *, timeout_s: float,
                      may_send: Callable[[], bool] | None = None,
                      headers: Mapping[str, str] | None = None,
                      content: bytes | None = None, json: Any = None,
                      params: Mapping[str, str] | None = None) -> httpx.Response:
        """One exchange; ``may_send`` (if given) is asked just before the first byte
        and raises :class:`SendWindowClosed` when it says no. ``timeout_s`` bounds the
        wait for a connection, the connect, and each write and read (as httpx's)."""
        content_type = None
        if json is not None:
            content = _json.dumps(json, ensure_ascii=False, separators=(",", ":"),
                                  allow_nan=False).encode()
            content_type = "application/json"
        target = _url(url, params)
        extensions: dict[str, Any] = {"timeout": {"connect": timeout_s, "read": timeout_s,
                                                  "write": timeout_s, "pool": timeout_s}}
        if may_send is not None:
            extensions["trace"] = _gated(may_send)
        length = len(content) if content is not None else (
            0 if method in ("POST", "PUT", "PATCH") else None)  # Content-Length: 0, as httpx
        wire_headers = _request_headers(headers, content_type, length)
        body = _Body(content) if content else None
        with trio.move_on_after(timeout_s) as waiting:
            await self._slots.acquire()
        if waiting.cancelled_caught:
            raise httpx.PoolTimeout("no free connection within the timeout")
        shard = self._shard(url)
        shard.busy += 1
        try:
            answer = await shard.pool.request(method, target, headers=wire_headers,
                                              content=body, extensions=extensions)
        except _HTTPCORE_ERRORS as exc:
            raise _as_httpx(exc) from exc
        finally:
            shard.busy -= 1
            self._slots.release()
        return _answer(answer.status, answer.headers, answer.content)

    async def aclose(self) -> None:
        for shards in self._origins.values():
            for shard in shards:
                await shard.pool.aclose()


@attrs.define(eq=False)
class HttpExecutor:
    """One shared HTTP/1.1 client for provider calls (keep-alive, no retries)."""

    client: BoundedHttp = attrs.field(factory=lambda: BoundedHttp.open(32))

    async def aclose(self) -> None:
        await self.client.aclose()

    async def dispatch(
        self, prepared: PreparedRequest, token: str, timeout_s: float,
        may_send: Callable[[], bool] | None = None,
    ) -> tuple[DispatchObservation, dict[str, Any]]:
        """Exactly one exchange. Returns the observation and safe provider evidence.

        ``may_send`` is the send gate (see the module's docstring)."""
        headers = {**prepared.safe_headers, **_credential(prepared.auth, token)}
        try:
            response = await self.client.request(
                prepared.method, prepared.url, content=prepared.body, headers=headers,
                timeout_s=timeout_s, may_send=may_send,
            )
        except SendWindowClosed:
            return DispatchObservation(Phase.HELD, detail=SEND_WINDOW_CLOSED), {}
        except httpx.PoolTimeout:
            # Our own connection limit (BoundedHttp's wait), not the provider's.
            return DispatchObservation(Phase.HELD, detail=CONNECTION_WAIT), {}
        except _NOT_SENT as exc:
            return DispatchObservation(Phase.NOT_CONNECTED, detail=type(exc).__name__), {}
        except httpx.HTTPError as exc:
            return DispatchObservation(Phase.SENT, detail=type(exc).__name__,
                                       idempotency_header=prepared.idempotency_header,
                                       exchange=excerpt_of(prepared.body)), {}
        spec = prepared.response
        evidence: dict[str, Any] = {"status": response.status_code}
        for name in spec.evidence_headers:
            if name in response.headers:
                evidence[name] = response.headers[name][:128]
        try:
            doc = response.json()
        except ValueError:
            doc = None
        for name, pointer in spec.evidence_fields:
            value = _evidence_value(pointer.find(doc))
            if value is not None:
                evidence[name] = value
        if spec.updated_at is not None and 200 <= response.status_code < 300:
            modified = _parse_time_us(spec.updated_at.find(doc))
            if modified is not None:
                evidence[MODIFIED_AT] = modified
        identity = None
        if spec.identity is not None:
            identity = IdentityEvidence(expected=prepared.remote_id,
                                        named=identity_text(spec.identity.find(doc)))
        return (
            DispatchObservation(
                Phase.RESPONDED,
                status=response.status_code,
                retry_after_s=_retry_after(response.headers.get("retry-after")),
                identity=identity,
                quota_headers=tuple((name, response.headers[name][:32])
                                      for name in prepared.quota_headers
                                      if name in response.headers),
                idempotency_header=prepared.idempotency_header,
                # Only a failed call keeps its exchange: a success writes nothing more.
                exchange=None if 200 <= response.status_code < 300 else excerpt_of(
                    prepared.body, response.headers.items(), response.content),
            ),
            evidence,
        )

    async def read(
        self,
        operation: OperationDefinition,
        binding: BindingSettings,
        remote_id: str,
        properties: list[str],
        token: str,
        timeout_s: float,
    ) -> RemoteSnapshot:
        """The definition's read-back; raises ``httpx.HTTPError`` or ``LookupError``."""
        read = operation.read
        if read is None:
            raise LookupError(f"{operation.name} defines no read-back")
        path = read.path.render(remote_id=remote_id, field_names=properties)
        response = await self.client.request(
            read.method, binding.base_url.rstrip("/") + path,
            headers=_credential(read.auth, token), timeout_s=timeout_s,
        )
        if response.status_code in read.absent_statuses:
            return RemoteSnapshot(exists=False)
        if not 200 <= response.status_code < 300:
            raise LookupError(f"read-back answered {response.status_code}")
        return snapshot_of(read, remote_id, response.json())


def snapshot_of(read: ReadDefinition, remote_id: str, doc: Any) -> RemoteSnapshot:
    """What a read-back document shows, by the definition's pointers (pure).

    Raises ``LookupError`` when the document has no field map where the
    definition says, or names another record than the pinned one.
    """
    props = read.fields.find(doc)
    if not isinstance(props, dict):
        raise LookupError(f"read-back has no fields object at {read.fields.text}")
    if read.id is not None and identity_text(read.id.find(doc)) != remote_id:
        raise LookupError("read-back names another record than the pinned one")
    return RemoteSnapshot(
        exists=True,
        properties={k: v for k, v in props.items() if v is None or isinstance(v, str)},
        updated_at_us=_parse_time_us(read.updated_at.find(doc))
        if read.updated_at is not None else None,
    )


async def exchange(client: BoundedHttp, method: str, url: str, *, headers: Mapping[str, str],
                   body: bytes | None, timeout_s: float,
                   may_send: Callable[[], bool] | None = None,
                   quota_headers: tuple[str, ...] = ()) -> tuple[DispatchObservation, Any]:
    """Exactly one exchange of a request an L1 template made outside an operation (a
    webhook subscription's create or delete): how far it got, and the decoded JSON
    answer (None when there is none). Never retried; the same "nothing was sent" rule and
    send gate (``may_send``) as :meth:`HttpExecutor.dispatch`; ``quota_headers``: the
    response headers the provider's quota dimensions name, kept in the observation."""
    try:
        response = await client.request(method, url, content=body, headers=dict(headers),
                                        timeout_s=timeout_s, may_send=may_send)
    except SendWindowClosed:
        return DispatchObservation(Phase.NOT_CONNECTED, detail=SEND_WINDOW_CLOSED), None
    except _NOT_SENT as exc:
        return DispatchObservation(Phase.NOT_CONNECTED, detail=type(exc).__name__), None
    except httpx.HTTPError as exc:
        return DispatchObservation(Phase.SENT, detail=type(exc).__name__), None
    try:
        doc = response.json() if response.content else None
    except ValueError:
        doc = None
    return DispatchObservation(
        Phase.RESPONDED, status=response.status_code,
        retry_after_s=_retry_after(response.headers.get("retry-after")),
        quota_headers=tuple((name, response.headers[name][:32]) for name in quota_headers
                            if name in response.headers)), doc
