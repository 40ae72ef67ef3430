"""The webhook ingress listener: ``POST /hooks/{route}`` -> a durable IngressReceipt -> 200.

Theory of operation
-------------------
A plain ASGI app (no framework: every byte and every deadline of the request is ours),
served by hypercorn on trio on its own listener (``[ingress] listen``)::

    request -> route (404) -> method (405) -> content type (415) -> body within
    max_body_bytes (413) and request_deadline (408) -> verify, pure (401)
    -> a match with a route's previous secret that retired itself (401)
    -> receipt within request_deadline more: the database within db_deadline, else the
    local spool -> 200; a receipt larger than the database takes in one statement
    (MariaDB's max_allowed_packet) is refused before its 200 (413, counted
    too_large_to_store): neither the database nor the spool's forwarder could ever store it
    (a duplicate is 200 too); the spool full -> 503

After the database failed to take a receipt in time, the following ones go straight to the
spool for ``DB_SUSPECT_S`` (each would otherwise wait ``db_deadline`` first); then one
receipt probes the database while the others still go to the spool, and its answer ends or
renews the suspicion.

Nothing else happens before the receipt is durable: no Flow, provider or Runtime work
(the materializer reads receipts later). Every answer other than 200 is counted by
reason (``integrationd_ingress_rejections_total``) and logged without the payload, the
signature or the secret. The route contract (signature, payload pointers, content types)
is L1 data; which route serves which binding, its subscription generation and its
secrets are L2 (``[[webhook_routes]]``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from config.definitions import WebhookDefinition
from config.settings import IngressSettings, WebhookRoute
from daemon.core.ingress import dedup_key
from daemon.core.webhook_signature import verify
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.ingress_spool import IngressSpool, SpoolFull
from daemon.services.metrics import Metrics
from daemon.services.secret_retirements import SecretRetirements
from storage.idgen import new_ulid
from storage.ingress.receipts import IngressReceipt, ReceiptInsert
from storage.port import StatementTooLarge, StorageError

PREFIX = "/hooks/"
# How long receipts skip the database (straight to the spool) after it failed to take one
# in time; the next receipt after that tries it again.
DB_SUSPECT_S = 1.0
# Headers kept on the receipt (lower-case): never a signature, cookie or authorization.
SAFE_HEADERS = ("content-type", "user-agent", "content-length")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@attrs.frozen
class BoundRoute:
    """One L2 route with its L1 contract."""

    route: WebhookRoute
    webhook: WebhookDefinition

    def safe_headers(self) -> tuple[str, ...]:
        extra = [self.webhook.payload.delivery_id_header, self.webhook.signature.timestamp_header]
        return SAFE_HEADERS + tuple(h for h in extra if h)


class _TooLarge(Exception):
    pass


@attrs.define(eq=False)
class IngressApp:
    settings: IngressSettings
    routes: Mapping[str, BoundRoute]
    clock: Clock
    # Make a receipt durable in the database (duplicates included).
    insert: Callable[[IngressReceipt, int], Awaitable[ReceiptInsert]]
    spool: IngressSpool
    metrics: Metrics
    replica_id: str = ""
    # Called after a new receipt is in the database (the materializer's wake-up).
    on_stored: Callable[[], None] = lambda: None
    # Which routes' previous secrets are retired (None: every configured one accepted).
    retirements: SecretRetirements | None = None
    # After the database failed to take a receipt in time, receipts go straight to the
    # spool until then (trio time), instead of each waiting db_deadline first.
    _db_suspect_until: float = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = trio.current_time()
        await self._handle(scope, receive, send)
        self.metrics.ingress_seconds.observe(trio.current_time() - started)

    async def _answer(self, send: Send, status: int, code: str, message: str,
                      route: str = "", counted: str = "",
                      headers: tuple[tuple[bytes, bytes], ...] = ()) -> int:
        if status != 200:
            self.metrics.count_ingress(counted or code)
            logs.warn("ingress_refused", route=route[:64], status=status,
                      reason=counted or code)
        body = (b'{"code":"' + code.encode() + b'","message":"' + message.encode() + b'"}')
        try:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    *headers]})
            await send({"type": "http.response.body", "body": body})
        except Exception as exc:  # the server says "the client is gone", in its own way
            # The client went away before its answer (a 200's receipt is durable anyway).
            logs.warn("ingress_answer_lost", route=route[:64], status=status,
                      error=type(exc).__name__)
        return status

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> int:
        path: str = scope.get("path", "")
        route_name = path[len(PREFIX):] if path.startswith(PREFIX) else ""
        bound = self.routes.get(route_name)
        if bound is None:
            return await self._answer(send, 404, "unknown_route", "no such webhook route")
        if scope.get("method") != "POST":
            return await self._answer(send, 405, "method", "only POST", route_name,
                                      headers=((b"allow", b"POST"),))
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            key = name.decode("latin-1").lower()
            # A repeated header: the first one counts (a signature is never joined).
            headers.setdefault(key, value.decode("latin-1"))
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media not in bound.webhook.content_types:
            return await self._answer(send, 415, "content_type",
                                      "unsupported content type", route_name)
        limit = self.settings.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return await self._answer(send, 413, "too_large", "the body is too large",
                                      route_name)
        body: bytes | None = None
        with trio.move_on_after(self.settings.request_deadline):
            try:
                body = await _read_body(receive, limit)
            except _TooLarge:
                return await self._answer(send, 413, "too_large", "the body is too large",
                                          route_name)
            except _Disconnected:
                self.metrics.count_ingress("disconnected")
                logs.warn("ingress_refused", route=route_name, status=0, reason="disconnected")
                return 0
        if body is None:
            return await self._answer(send, 408, "deadline",
                                      "the request did not complete in time", route_name)
        # The body is here: the receipt gets its own budget (a replica that fell behind
        # still stores what it has read instead of refusing it; the loader keeps both
        # budgets together inside the provider's response window).
        deadline = trio.current_time() + self.settings.request_deadline
        return await self._receipt(send, bound, scope, headers, body, deadline)

    async def _receipt(self, send: Send, bound: BoundRoute, scope: Scope,
                       headers: dict[str, str], body: bytes, deadline: float) -> int:
        route = bound.route
        now_us = self.clock.now_us()
        verdict = verify(bound.webhook.signature, route.secrets(), method="POST",
                         uri=_uri(route, scope), body=body, headers=headers, now_us=now_us)
        if not verdict.ok:
            return await self._answer(send, 401, verdict.reason, "signature not accepted",
                                      route.route)
        if verdict.secret_index > 0 and self.retirements is not None and (
                await self.retirements.retired(route.route, route.secret_generation)):
            # The previous secret retired itself (docs/subscriptions.md): refused like any
            # bad signature, counted apart.
            return await self._answer(send, 401, "bad_signature", "signature not accepted",
                                      route.route, counted="retired_secret")
        payload = bound.webhook.payload
        delivery_id = headers.get(payload.delivery_id_header, "") if (
            payload.delivery_id_header) else ""
        if payload.delivery_id_stable and not delivery_id:
            return await self._answer(send, 401, "missing_signature",
                                      "the delivery id header is missing", route.route)
        receipt = IngressReceipt(
            receipt_id=new_ulid(now_us),
            dedup_key=dedup_key(payload, route=route.route,
                                subscription_generation=route.subscription_generation,
                                raw=body, delivery_id=delivery_id),
            route=route.route, binding_id=route.binding_id, webhook=bound.webhook.name,
            subscription_generation=route.subscription_generation, received_at_us=now_us,
            body=body, body_sha256=hashlib.sha256(body).hexdigest(),
            headers={h: headers[h][:256] for h in bound.safe_headers() if h in headers},
            verification=f"verified:{verdict.secret_index}", replica_id=self.replica_id,
        )
        result = None
        if trio.current_time() >= self._db_suspect_until:
            db_until = min(deadline, trio.current_time() + self.settings.db_deadline)
            if self._db_suspect_until:
                # The database failed us lately: this receipt probes it, alone; the others
                # keep going to the spool until the probe has its answer.
                self._db_suspect_until = db_until
            with trio.move_on_at(db_until):
                try:
                    result = await self.insert(receipt, now_us)
                except StatementTooLarge:
                    self._db_suspect_until = 0.0  # the database answered
                    return await self._answer(
                        send, 413, "too_large", "the body is too large to be stored",
                        route.route, counted="too_large_to_store")
                except StorageError as exc:
                    logs.warn("ingress_database_unavailable", route=route.route,
                              error=str(exc)[:200])
            self._db_suspect_until = (0.0 if result is not None
                                      else trio.current_time() + DB_SUSPECT_S)
        if result is not None:
            outcome = "stored" if result.stored else "duplicate"
            self.metrics.count_ingress(outcome)
            if result.stored:
                self.on_stored()
            return await self._answer(send, 200, outcome, "received", route.route)
        # The database did not make it durable in time: the local spool does.
        try:
            with trio.fail_at(deadline):
                await self.spool.append(attrs.evolve(receipt, via="spool"), now_us)
        except (SpoolFull, trio.TooSlowError) as exc:
            logs.warn("ingress_spool_refused", route=route.route, error=str(exc)[:200])
            return await self._answer(send, 503, "spool_full",
                                      "the receipt could not be made durable", route.route)
        self.metrics.count_ingress("spooled")
        return await self._answer(send, 200, "spooled", "received", route.route)


def _uri(route: WebhookRoute, scope: Scope) -> str:
    """The URI as the provider called it: the route's public URL, else this request's."""
    if route.public_url:
        query = scope.get("query_string", b"")
        return route.public_url + (("?" + query.decode("latin-1")) if query else "")
    host = ""
    for name, value in scope.get("headers", []):
        if name.lower() == b"host":
            host = value.decode("latin-1")
            break
    raw = scope.get("raw_path") or scope.get("path", "").encode()
    query = scope.get("query_string", b"")
    target = raw.decode("latin-1") + (("?" + query.decode("latin-1")) if query else "")
    return f"{scope.get('scheme', 'http')}://{host}{target}"


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class _Disconnected(Exception):
    pass


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def bind_routes(routes: tuple[WebhookRoute, ...],
                webhooks: Mapping[str, WebhookDefinition]) -> dict[str, BoundRoute]:
    """Each L2 route with its L1 contract (the loader has checked that both exist)."""
    return {r.route: BoundRoute(r, webhooks[r.webhook]) for r in routes}

