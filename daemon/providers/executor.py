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
it never retries (nor does the client under it, ``daemon/providers/http_client.py``).
:meth:`HttpExecutor.read` performs the definition's read-back for reconciliation.

Which exceptions mean "nothing was sent": failing to connect (refused, DNS,
connect timeout), waiting for a pooled connection, and a caller's *send gate*
that closed. The last two are our own side holding the request back
(``Phase.HELD``: contention, never a failed attempt); the first is
``NOT_CONNECTED``. Anything after that (write/read errors and timeouts, a peer
that closes without answering) may have delivered the request, so it is ``SENT``.

A send gate is asked at the last moment before the first byte leaves (on a
connection already taken, just before the request is framed and written): a
quota slot is a time window, and the wait for a connection, the connect and the
event loop's own lag all come after the runner's last check of it. A gate that
says no raises :class:`SendWindowClosed` there; nothing was written on the
connection, so it goes back to its pool as it was.

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
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import httpx

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
from daemon.providers.http_client import SAFE_KEEPALIVE_S as SAFE_KEEPALIVE_S
from daemon.providers.http_client import Answer as Answer
from daemon.providers.http_client import BoundedHttp as BoundedHttp
from daemon.providers.http_client import SendWindowClosed as SendWindowClosed
from daemon.providers.http_client import keepalive_below as keepalive_below
from daemon.providers.http_client import origin_of as origin_of
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


# The detail a closed send gate reports (the runner's own late check reports the same).
SEND_WINDOW_CLOSED = SLOT_EXPIRED

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
