"""The provider-neutral HTTP executor, driven by L1 operation definitions.

Theory of operation
-------------------
:func:`prepare` turns (operation definition, binding, remote id, frozen
request) into the exact bytes to send; it validates the sparse body against
the definition's allowed properties. :meth:`HttpExecutor.dispatch` performs
*one* exchange and reports a :class:`DispatchObservation` of how far it got;
it never retries (httpx does not retry requests, and its transport is built
with ``retries=0``). :meth:`HttpExecutor.read` performs the definition's
read-back for reconciliation.

Which exceptions mean "nothing was sent": failing to connect (refused, DNS,
connect timeout) and waiting for a pooled connection. Anything after that
(write/read errors and timeouts, a peer that closes without answering) may
have delivered the request, so it is ``SENT``.

Credentials are added at dispatch only; the prepared request keeps the
headers that are safe to store (everything except ``Authorization``).
"""

from __future__ import annotations

import datetime
import hashlib
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs
import httpx
import trio

from config.catalog import OperationDefinition
from config.settings import BindingSettings
from daemon.core.canonical import canonical_bytes
from daemon.core.effects import DispatchObservation, Phase, RemoteSnapshot


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


def prepare(
    operation: OperationDefinition,
    binding: BindingSettings,
    remote_id: str,
    request: Mapping[str, Any],
    idempotency_key: str,
) -> PreparedRequest:
    properties = request.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        raise BadRequestForOperation("request.properties must be a non-empty object")
    extra = set(properties) - operation.allowed_properties
    if extra:
        raise BadRequestForOperation(
            f"properties not allowed by {operation.name}: {', '.join(sorted(extra))}"
        )
    if not all(v is None or isinstance(v, str) for v in properties.values()):
        raise BadRequestForOperation("property values must be strings or null")
    path = operation.path.format(remote_id=urllib.parse.quote(remote_id, safe=""))
    body = canonical_bytes({"properties": dict(properties)})
    return PreparedRequest(
        method=operation.method,
        url=binding.base_url.rstrip("/") + path,
        path=path,
        body=body,
        safe_headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key},
        body_sha256="sha256:" + hashlib.sha256(body).hexdigest(),
        idempotency_key=idempotency_key,
        desired=dict(properties),
    )


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP-date: fall back to the contract's default


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


_EVIDENCE_HEADERS = ("x-hubspot-correlation-id", "x-request-id", "request-id")
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def new_http_client(max_connections: int, tls: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """An HTTP/1.1 client with keep-alive and no retries of any kind.

    The limits go to the transport (a client ignores its own ``limits`` when
    given a transport). ``tls`` lets many clients share one context: each
    default context loads the CA bundle again (time and ~0.7 MB apiece).
    """
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(
            retries=0, trust_env=False, verify=tls or httpx.create_ssl_context(),
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections),
        ),
        follow_redirects=False,
        trust_env=False,
    )


# Connections per httpx client. httpcore's pool does work proportional to its
# size on every request: one client's CPU per exchange was 550 us with 4
# connections and 1,270 us with 32 (``python -m bench.http_floor``), so many
# connections are many small clients.
SHARD_CONNECTIONS = 4


@attrs.define(eq=False)
class _Shard:
    client: httpx.AsyncClient
    busy: int = 0


@attrs.define(eq=False)
class BoundedHttp:
    """httpx clients that admit one request per pooled connection at a time.

    Each origin (scheme and host:port) gets its own small clients of
    ``SHARD_CONNECTIONS`` connections, made as its load needs them, so a
    client never closes a kept-alive connection to one origin to open one to
    another, and its pool stays small. A request goes to the least busy
    client of its origin. Requests over ``max_connections`` in all wait on a
    semaphore instead of in httpcore's queue; a wait longer than the
    request's own timeout fails as ``httpx.PoolTimeout``: nothing was sent.
    """

    max_connections: int
    _tls: ssl.SSLContext = attrs.field(init=False, factory=httpx.create_ssl_context)
    _slots: trio.Semaphore = attrs.field(init=False)
    _origins: dict[str, list[_Shard]] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(self.max_connections)

    @classmethod
    def open(cls, max_connections: int) -> BoundedHttp:
        return cls(max_connections)

    def _shard(self, url: str) -> _Shard:
        parts = urllib.parse.urlsplit(url)
        shards = self._origins.setdefault(f"{parts.scheme}://{parts.netloc}", [])
        shard = min(shards, key=lambda s: s.busy, default=None)
        if shard is None or shard.busy >= SHARD_CONNECTIONS:
            shard = _Shard(new_http_client(SHARD_CONNECTIONS, self._tls))
            shards.append(shard)
        return shard

    async def request(self, method: str, url: str, *, timeout_s: float,
                      **kwargs: Any) -> httpx.Response:
        with trio.move_on_after(timeout_s) as waiting:
            await self._slots.acquire()
        if waiting.cancelled_caught:
            raise httpx.PoolTimeout("no free connection within the timeout")
        shard = self._shard(url)
        shard.busy += 1
        try:
            return await shard.client.request(method, url, timeout=timeout_s, **kwargs)
        finally:
            shard.busy -= 1
            self._slots.release()

    async def aclose(self) -> None:
        for shards in self._origins.values():
            for shard in shards:
                await shard.client.aclose()


@attrs.define(eq=False)
class HttpExecutor:
    """One shared HTTP/1.1 client for provider calls (keep-alive, no retries)."""

    client: BoundedHttp = attrs.field(factory=lambda: BoundedHttp.open(32))

    async def aclose(self) -> None:
        await self.client.aclose()

    async def dispatch(
        self, prepared: PreparedRequest, token: str, timeout_s: float
    ) -> tuple[DispatchObservation, dict[str, Any]]:
        """Exactly one exchange. Returns the observation and safe provider evidence."""
        headers = {**prepared.safe_headers, "Authorization": f"Bearer {token}"}
        try:
            response = await self.client.request(
                prepared.method, prepared.url, content=prepared.body, headers=headers,
                timeout_s=timeout_s,
            )
        except _NOT_SENT as exc:
            return DispatchObservation(Phase.NOT_CONNECTED, detail=type(exc).__name__), {}
        except httpx.HTTPError as exc:
            return DispatchObservation(Phase.SENT, detail=type(exc).__name__), {}
        evidence: dict[str, Any] = {"status": response.status_code}
        for name in _EVIDENCE_HEADERS:
            if name in response.headers:
                evidence[name] = response.headers[name][:128]
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            for field in ("id", "updatedAt", "category"):
                if isinstance(doc.get(field), str):
                    evidence[field] = doc[field][:128]
        return (
            DispatchObservation(
                Phase.RESPONDED,
                status=response.status_code,
                retry_after_s=_retry_after(response.headers.get("retry-after")),
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
        path = read.path.format(
            remote_id=urllib.parse.quote(remote_id, safe=""),
            properties=urllib.parse.quote(",".join(properties), safe=","),
        )
        response = await self.client.request(
            read.method, binding.base_url.rstrip("/") + path,
            headers={"Authorization": f"Bearer {token}"}, timeout_s=timeout_s,
        )
        if response.status_code == 404:
            return RemoteSnapshot(exists=False)
        if response.status_code != 200:
            raise LookupError(f"read-back answered {response.status_code}")
        doc = response.json()
        props = doc.get("properties") if isinstance(doc, dict) else None
        if not isinstance(props, dict):
            raise LookupError("read-back has no properties object")
        return RemoteSnapshot(
            exists=True,
            properties={k: v for k, v in props.items() if v is None or isinstance(v, str)},
            updated_at_us=_parse_time_us(doc.get(read.updated_at_field))
            if read.updated_at_field else None,
        )
