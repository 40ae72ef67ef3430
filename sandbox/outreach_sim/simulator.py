"""OutreachSimulator: the JSON:API Prospects and Webhooks API, the webhook sender, faults.

Every provider request goes through :meth:`OutreachSimulator.handle`:

1. take the first armed fault that matches it (faults model the network and the front
   door, which act before auth);
2. body size (413), auth (401), rate limit (429), route (404/405), content type (415),
   body shape (400/409/422), record exists (404);
3. append one :class:`RequestRecord` to the journal; answer, or ``ABORT``.

A state change that Outreach would announce (a Prospect created, updated or destroyed,
through the API or the control API) queues one delivery per matching active subscription.
The sender posts each delivery with a fresh ``Outreach-Webhook-ID`` and the hex
HMAC-SHA256 of the raw body in ``Outreach-Webhook-Signature``; any HTTP status, 5xx
included, counts as delivered (Outreach's rule); only a network failure (refused, reset,
no answer within ``response_window`` seconds) is retried, ``redeliveries`` times,
``redelivery_delay`` seconds apart, each retry with a new request id and the same body.
Every attempt is journaled, one the sender itself cut off by stopping ``interrupted``.

All state lives in one trio thread; a state change, its journal record and its queued
deliveries happen with no await between them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode

import attrs
import httpx
import trio

from sandbox.h11_server import ABORT, Abort, H11Server, Request, Response
from sandbox.hubspot_sim.model import Fault, FaultQueue
from sandbox.outreach_sim.model import (
    PAYLOAD_VERSIONS,
    WEBHOOK_ACTIONS,
    WEBHOOK_RESOURCES,
    Attributes,
    Change,
    DeliveryRecord,
    Prospect,
    RateWindow,
    RequestRecord,
    Subscription,
    decode_cursor,
    encode_cursor,
    iso8601,
    now_us,
    parse_iso8601,
    parse_range,
    validate_attributes,
    wire_precision,
)
from sandbox.s2s_token_sim import Route

API_PREFIX: Final = "/api/v2/"
PROSPECTS_PATH: Final = "/api/v2/prospects"
WEBHOOKS_PATH: Final = "/api/v2/webhooks"
CONTROL_PREFIX: Final = "/_sim/"
JSONAPI: Final = "application/vnd.api+json"
MAX_BODY: Final = 64 * 1024
DEFAULT_PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 1000
SIGNATURE_HEADER: Final = "Outreach-Webhook-Signature"
REQUEST_ID_HEADER: Final = "Outreach-Webhook-ID"
CLEANUP_TOKEN_HEADER: Final = "Outreach-Cleanup-Token"  # noqa: S105 (a header's name)

_JSON_HEADERS: Final = (("content-type", JSONAPI),)


def jsonapi_response(status: int, doc: object,
                     headers: tuple[tuple[str, str], ...] = ()) -> Response:
    body = b"" if status == 204 else json.dumps(doc, separators=(",", ":")).encode()
    return Response(status, body, _JSON_HEADERS + headers)


def error_response(status: int, title: str, detail: str,
                   headers: tuple[tuple[str, str], ...] = ()) -> Response:
    """JSON:API's error document (Outreach's shape: ``errors`` with id, title, detail)."""
    doc = {"errors": [{"id": title.lower().replace(" ", "_"), "title": title,
                       "detail": detail}]}
    return jsonapi_response(status, doc, headers)


def sign(secret: str, body: bytes) -> str:
    """Outreach's webhook signature: hex HMAC-SHA256 of the raw body with the secret."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@attrs.frozen
class _Outcome:
    response: Response
    applied: bool


@attrs.frozen
class _Delivery:
    subscription: Subscription
    change: Change
    body: bytes
    event_name: str


@attrs.define(eq=False)
class OutreachSimulator:
    """An in-memory Outreach API v2 (Prospects, Webhooks) on a real loopback server.

    ``tokens`` are the valid bearer tokens (hidden from ``repr``; a test or, at merge, the
    S2S token endpoint adds to them). ``clock`` gives microseconds (tests pin it to make
    equal ``updatedAt`` values on purpose).
    """

    tokens: set[str] = attrs.field(repr=False)
    max_body: int = MAX_BODY
    rate_limit: int = 10_000
    response_window: float = 5.0
    redeliveries: int = 3
    redelivery_delay: float = 1.0
    clock: Callable[[], int] = now_us
    # Other endpoints served on the same port before the provider's own (the S2S token
    # endpoint's ``s2s_routes``): no fault, auth, rate limit or journal of ours applies.
    mounts: list[Route] = attrs.field(factory=list)
    # The rate headers, for tests of a client reading them: whether a 429 carries
    # Retry-After (False: only x-ratelimit-reset says when), how x-ratelimit-reset says
    # it ("seconds" until the reset, or "epoch_seconds"), or a text sent verbatim instead.
    retry_after_on_429: bool = True
    reset_format: str = attrs.field(
        default="seconds", validator=attrs.validators.in_(("seconds", "epoch_seconds")))
    reset_text: str | None = None
    requests: list[RequestRecord] = attrs.field(factory=list, init=False)
    deliveries: list[DeliveryRecord] = attrs.field(factory=list, init=False)
    _prospects: dict[int, Prospect] = attrs.field(factory=dict, init=False)
    _subscriptions: dict[int, Subscription] = attrs.field(factory=dict, init=False)
    _faults: FaultQueue = attrs.field(factory=FaultQueue, init=False)
    _window: RateWindow = attrs.field(init=False)
    _next_prospect: int = attrs.field(default=1, init=False)
    _next_subscription: int = attrs.field(default=1, init=False)
    _drop_next: int = attrs.field(default=0, init=False)
    _pending: int = attrs.field(default=0, init=False)
    _idle: trio.Event = attrs.field(factory=trio.Event, init=False)
    _send: trio.MemorySendChannel[_Delivery] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[_Delivery] = attrs.field(init=False)
    _server: H11Server | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._window = RateWindow(limit=self.rate_limit)
        self._send, self._receive = trio.open_memory_channel[_Delivery](math.inf)
        self._idle.set()

    async def run(self, host: str = "127.0.0.1", port: int = 0, *,
                  task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on ``host:port`` (0 picks a port) and send webhooks until cancelled."""
        self._server = H11Server(self.handle, max_body=self.max_body)
        async with httpx.AsyncClient(timeout=self.response_window) as client, \
                trio.open_nursery() as nursery:
            nursery.start_soon(self._sender, client, nursery)
            port = await nursery.start(self._server.run, host, port)
            task_status.started(port)

    # ---- state, for tests in the same process (the control API wraps these) ----

    def put_prospect(self, attributes: Mapping[str, Any], *, prospect_id: int | None = None,
                     notify: bool = False) -> Prospect:
        """Create (or overwrite) a Prospect; ``notify`` sends ``prospect.created``."""
        fields = validate_attributes(attributes, what="attributes")
        if prospect_id is None:
            while self._next_prospect in self._prospects:
                self._next_prospect += 1
            prospect_id = self._next_prospect
        if prospect_id < 1:
            raise ValueError("a Prospect id is a positive integer")
        self._next_prospect = max(self._next_prospect, prospect_id + 1)
        stamp = self.clock()
        prospect = Prospect(prospect_id, fields, stamp, stamp)
        self._prospects[prospect_id] = prospect
        if notify:
            full = prospect.to_resource()["attributes"]
            self._announce(Change("created", prospect_id, full, {}))
        return prospect

    def update_prospect(self, prospect_id: int, changes: Mapping[str, Any], *,
                        updated_at: str | None = None, notify: bool = True) -> Prospect:
        """Change a Prospect as a user in Outreach would; ``KeyError`` if unknown."""
        prospect = self._prospects.get(prospect_id)
        if prospect is None:
            raise KeyError(f"prospect {prospect_id}")
        fields = validate_attributes(changes, what="attributes")
        stamp = parse_iso8601(updated_at) if updated_at is not None else None
        self._apply(prospect, fields, stamp, notify=notify)
        return prospect

    def bulk_update(self, prospect_ids: list[int], changes: Mapping[str, Any], *,
                    updated_at: str, notify: bool = True) -> int:
        """Set ``changes`` on many Prospects with one ``updatedAt`` (a bulk edit in the
        Outreach UI); returns how many changed."""
        fields = validate_attributes(changes, what="attributes")
        stamp = parse_iso8601(updated_at)
        missing = [i for i in prospect_ids if i not in self._prospects]
        if missing:
            raise KeyError(f"prospects {missing[:5]}")
        for prospect_id in prospect_ids:
            self._apply(self._prospects[prospect_id], fields, stamp, notify=notify)
        return len(prospect_ids)

    def destroy_prospect(self, prospect_id: int, *, notify: bool = True) -> None:
        del self._prospects[prospect_id]
        if notify:
            self._announce(Change("destroyed", prospect_id, {}, {}))

    def prospect(self, prospect_id: int) -> dict[str, Any] | None:
        found = self._prospects.get(prospect_id)
        return None if found is None else found.to_resource()

    def subscriptions(self) -> list[Subscription]:
        return list(self._subscriptions.values())

    def set_subscription_active(self, subscription_id: int, active: bool) -> None:
        self._subscriptions[subscription_id].active = active

    def subscribe_direct(self, *, resource: str, action: str, url: str, secret: str,
                         payload_version: int = 2) -> int:
        """A subscription made outside any client (an earlier install's, say): its id."""
        subscription = Subscription(
            id=self._next_subscription, resource=resource, action=action, url=url,
            secret=secret, payload_version=payload_version,
            cleanup_token=secrets.token_urlsafe(24), created_us=self.clock())
        self._next_subscription += 1
        self._subscriptions[subscription.id] = subscription
        return subscription.id

    def delete_subscription_behind_back(self, subscription_id: int) -> None:
        """An Outreach admin deletes the subscription (no client knows)."""
        del self._subscriptions[subscription_id]

    def drop_deliveries(self, count: int) -> None:
        """Lose the next ``count`` deliveries on purpose (journaled as ``dropped``)."""
        if count < 0:
            raise ValueError("count must be >= 0")
        self._drop_next += count

    def inject(self, fault: Fault) -> None:
        self._faults.push(fault)

    def set_rate(self, limit: int, window_s: float = 3600.0) -> None:
        """A new rate limit of ``limit`` requests per ``window_s`` per token (counts
        start again)."""
        if limit <= 0 or window_s <= 0:
            raise ValueError("limit and window must be positive")
        self.rate_limit = limit
        self._window = RateWindow(limit=limit, window_us=int(window_s * 1_000_000))

    def clear_faults(self) -> int:
        return self._faults.clear()

    def pending_faults(self) -> list[tuple[Fault, int]]:
        return self._faults.pending()

    def reset(self) -> None:
        """Forget Prospects, subscriptions, faults, journals and rate counters."""
        self._prospects.clear()
        self._subscriptions.clear()
        self._faults.clear()
        self._window.clear()
        self.requests.clear()
        self.deliveries.clear()
        self._next_prospect = 1
        self._next_subscription = 1
        self._drop_next = 0

    async def wait_deliveries_settled(self) -> None:
        """Return once every queued delivery is delivered, dropped or given up."""
        await self._idle.wait()

    # ---- changes and the webhook sender ----

    def _apply(self, prospect: Prospect, fields: Attributes, stamp: int | None, *,
               notify: bool) -> None:
        changed = {k: v for k, v in fields.items() if prospect.attributes.get(k) != v}
        before = {k: prospect.attributes.get(k) for k in changed}
        prospect.attributes.update(fields)
        if stamp is None:
            # Strictly increasing at wire precision, so two changes never share a stamp
            # unless a bulk update asks for it.
            stamp = max(self.clock(), wire_precision(prospect.updated_us) + 1000)
        before["updatedAt"] = iso8601(prospect.updated_us)
        prospect.updated_us = stamp
        if notify:
            self._announce(Change("updated", prospect.id,
                                  {**changed, "updatedAt": iso8601(stamp)}, before))

    def _announce(self, change: Change) -> None:
        # One event fans out to every matching subscription at one moment: each copy
        # carries the same deliveredAt, so copies of one change differ only by signature
        # (read per subscription, a millisecond tick between two copies made them two
        # different events, and which one a test saw first depended on the machine's load).
        delivered_at = iso8601(self.clock())
        for subscription in self._subscriptions.values():
            if not subscription.matches("prospect", change.action):
                continue
            event_name = f"prospect.{change.action}"
            body = _payload(subscription.payload_version, change, event_name, delivered_at)
            self._pending += 1
            if self._idle.is_set():
                self._idle = trio.Event()
            self._send.send_nowait(_Delivery(subscription, change, body, event_name))

    async def _sender(self, client: httpx.AsyncClient, nursery: trio.Nursery) -> None:
        async for delivery in self._receive:
            nursery.start_soon(self._deliver, client, delivery)

    async def _deliver(self, client: httpx.AsyncClient, delivery: _Delivery) -> None:
        try:
            for attempt in range(1, self.redeliveries + 2):
                if attempt == 1 and self._drop_next > 0:
                    self._drop_next -= 1
                    self._journal_delivery(delivery, attempt, "", "dropped", None)
                    return
                request_id = str(uuid.uuid4())
                headers = {
                    "content-type": JSONAPI,
                    REQUEST_ID_HEADER: request_id,
                    SIGNATURE_HEADER: sign(delivery.subscription.secret, delivery.body),
                }
                try:
                    response = await client.post(delivery.subscription.url,
                                                 content=delivery.body, headers=headers)
                except httpx.TransportError:
                    self._journal_delivery(delivery, attempt, request_id, "network_error",
                                           None)
                    if attempt <= self.redeliveries:
                        await trio.sleep(self.redelivery_delay)
                    continue
                except trio.Cancelled:
                    # The sender itself stops (shut down, restarted) with this request in
                    # flight: its bytes may have arrived and been stored, so the journal
                    # shows the attempt; no answer, and no redelivery (its memory of the
                    # delivery dies with it).
                    self._journal_delivery(delivery, attempt, request_id, "interrupted",
                                           None)
                    raise
                # Any status, 5xx included, is "delivered": Outreach does not retry it.
                self._journal_delivery(delivery, attempt, request_id, "delivered",
                                       response.status_code)
                return
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._idle.set()

    def _journal_delivery(self, delivery: _Delivery, attempt: int, request_id: str,
                          outcome: str, status: int | None) -> None:
        self.deliveries.append(DeliveryRecord(
            seq=len(self.deliveries) + 1, subscription_id=delivery.subscription.id,
            event_name=delivery.event_name, prospect_id=delivery.change.prospect_id,
            attempt=attempt, request_id=request_id,
            body_sha256=hashlib.sha256(delivery.body).hexdigest(), outcome=outcome,
            status=status,
        ))

    # ---- HTTP ----

    async def handle(self, request: Request) -> Response | Abort:
        for method, pattern, mounted in self.mounts:
            match = pattern.match(request.path)
            if match is not None and request.method == method:
                return await mounted(request, match)
        if request.path.startswith(CONTROL_PREFIX):
            from sandbox.outreach_sim.control import handle_control
            return handle_control(self, request)
        received_at = time.time()
        fault = self._faults.take(request.method, request.path)
        if fault is None:
            outcome = self._provider(request)
        elif fault.mode == "latency":
            await trio.sleep(fault.latency_ms / 1000)
            outcome = self._provider(request)
        elif fault.mode == "status":
            outcome = _Outcome(error_response(fault.status, "Injected Fault", "injected"),
                               applied=False)
        elif fault.mode == "rate_limit":
            outcome = _Outcome(self._throttled(fault.retry_after_s * 1_000_000), False)
        elif fault.mode == "reset_before":
            self._record(request, received_at, None, applied=False)
            return ABORT
        elif fault.mode == "reset_after":
            outcome = self._provider(request)
            self._record(request, received_at, None, outcome.applied)
            return ABORT
        else:  # other_record: a 200 naming another record, nothing applied
            outcome = _Outcome(self._other_record(request, fault.record_id), applied=False)
        self._record(request, received_at, outcome.response.status, outcome.applied)
        return outcome.response

    def _record(self, request: Request, received_at: float, status: int | None,
                applied: bool) -> None:
        digest = "" if request.body_too_large else hashlib.sha256(request.body).hexdigest()
        self.requests.append(RequestRecord(
            seq=len(self.requests) + 1, method=request.method, path=request.path,
            query=request.query, status=status, applied=applied, body_sha256=digest,
            received_at=received_at,
        ))

    def _reset_header(self, reset_us: int) -> str:
        """``x-ratelimit-reset`` for a window resetting ``reset_us`` from now."""
        if self.reset_text is not None:
            return self.reset_text
        if self.reset_format == "epoch_seconds":
            return str(math.ceil((self.clock() + reset_us) / 1_000_000))
        return str(max(1, math.ceil(reset_us / 1_000_000)))

    def _throttled(self, reset_us: int) -> Response:
        reset_s = max(1, math.ceil(reset_us / 1_000_000))
        retry = (("retry-after", str(reset_s)),) if self.retry_after_on_429 else ()
        return error_response(429, "Too Many Requests", "rate limit exceeded", (
            *retry,
            ("x-ratelimit-limit", str(self._window.limit)),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", self._reset_header(reset_us)),
        ))

    def _provider(self, request: Request) -> _Outcome:
        if request.body_too_large:
            return _Outcome(error_response(413, "Payload Too Large",
                                           f"body over {self.max_body} bytes"), False)
        token = self._token(request)
        cleanup = request.headers.get(CLEANUP_TOKEN_HEADER.lower())
        webhook_id = _member_id(request.path, WEBHOOKS_PATH)
        if token is None and cleanup and request.method == "DELETE" and webhook_id:
            # Orphan cleanup after the install's credentials are gone: the cleanup token
            # handed out at creation is the only credential, for that one subscription.
            if self.cleanup_delete(webhook_id, cleanup):
                return _Outcome(jsonapi_response(204, None), True)
            return _Outcome(error_response(401, "Unauthorized", "invalid cleanup token"),
                            False)
        if token is None:
            return _Outcome(error_response(401, "Unauthorized",
                                           "missing or invalid bearer token"), False)
        allowed, remaining, reset_us = self._window.take(token, self.clock())
        if not allowed:
            return _Outcome(self._throttled(reset_us), False)
        outcome = self._route(request)
        limits = (("x-ratelimit-limit", str(self._window.limit)),
                  ("x-ratelimit-remaining", str(remaining)),
                  ("x-ratelimit-reset", self._reset_header(reset_us)))
        response = outcome.response
        return _Outcome(Response(response.status, response.body, response.headers + limits),
                        outcome.applied)

    def _token(self, request: Request) -> str | None:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        return token if scheme.lower() == "bearer" and token in self.tokens else None

    def _route(self, request: Request) -> _Outcome:
        path, method = request.path, request.method
        if path == PROSPECTS_PATH:
            if method == "GET":
                return _Outcome(self._list(request), False)
            if method == "POST":
                return self._create(request)
            return _Outcome(_not_allowed("GET, POST"), False)
        prospect_id = _member_id(path, PROSPECTS_PATH)
        if prospect_id is not None:
            if method == "GET":
                return _Outcome(self._read(prospect_id), False)
            if method == "PATCH":
                return self._update(request, prospect_id)
            if method == "DELETE":
                if prospect_id not in self._prospects:
                    return _Outcome(_not_found("prospect", prospect_id), False)
                self.destroy_prospect(prospect_id)
                return _Outcome(jsonapi_response(204, None), True)
            return _Outcome(_not_allowed("GET, PATCH, DELETE"), False)
        if path == WEBHOOKS_PATH:
            if method == "GET":
                docs = [s.to_resource() for s in self._subscriptions.values()]
                return _Outcome(jsonapi_response(200, {"data": docs}), False)
            if method == "POST":
                return self._subscribe(request)
            return _Outcome(_not_allowed("GET, POST"), False)
        webhook_id = _member_id(path, WEBHOOKS_PATH)
        if webhook_id is not None:
            return self._webhook_member(request, webhook_id)
        return _Outcome(error_response(404, "Not Found", "no such route"), False)

    def _read(self, prospect_id: int) -> Response:
        found = self._prospects.get(prospect_id)
        if found is None:
            return _not_found("prospect", prospect_id)
        return jsonapi_response(200, {"data": found.to_resource()})

    def _list(self, request: Request) -> Response:
        params = dict(parse_qsl(request.query, keep_blank_values=True))
        try:
            size = int(params.get("page[size]", DEFAULT_PAGE_SIZE))
            if not 1 <= size <= MAX_PAGE_SIZE:
                raise ValueError
        except ValueError:
            return error_response(400, "Bad Request",
                                  f"page[size] must be an integer in 1..{MAX_PAGE_SIZE}")
        sort = params.get("sort", "id")
        if sort not in ("id", "updatedAt"):
            return error_response(400, "Bad Request", "sort must be id or updatedAt")
        try:
            low, high = parse_range(params["filter[updatedAt]"]) \
                if "filter[updatedAt]" in params else (None, None)
            after = decode_cursor(params["page[after]"]) if "page[after]" in params else None
        except ValueError as exc:
            return error_response(400, "Bad Request", str(exc))
        rows = list(self._prospects.values())
        if low is not None:
            rows = [p for p in rows if wire_precision(p.updated_us) >= low]
        if high is not None:
            rows = [p for p in rows if wire_precision(p.updated_us) <= high]
        if sort == "updatedAt":
            rows.sort(key=Prospect.sort_key)
            if after is not None:
                rows = [p for p in rows if p.sort_key() > after]
        else:
            rows.sort(key=lambda p: p.id)
            if after is not None:
                rows = [p for p in rows if p.id > after[1]]
        page = rows[:size]
        links: dict[str, str] = {}
        if len(rows) > size:
            last = page[-1]
            query = {k: v for k, v in params.items() if k != "page[after]"}
            query["page[after]"] = encode_cursor(last.updated_us, last.id)
            host = request.headers.get("host", "127.0.0.1")
            links["next"] = f"http://{host}{PROSPECTS_PATH}?{urlencode(query)}"
        return jsonapi_response(200, {"data": [p.to_resource() for p in page],
                                      "links": links, "meta": {"count": len(rows)}})

    def _body(self, request: Request) -> dict[str, Any] | Response:
        media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media != JSONAPI:
            return error_response(415, "Unsupported Media Type",
                                  f"Content-Type must be {JSONAPI}")
        try:
            doc = json.loads(request.body)
        except (ValueError, RecursionError):
            return error_response(400, "Bad Request", "body is not valid JSON")
        if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
            return error_response(400, "Bad Request", "body must be {\"data\": {...}}")
        data: dict[str, Any] = doc["data"]
        return data

    def _create(self, request: Request) -> _Outcome:
        data = self._body(request)
        if isinstance(data, Response):
            return _Outcome(data, False)
        if data.get("type") != "prospect":
            return _Outcome(error_response(409, "Conflict", "data.type must be prospect"),
                            False)
        try:
            prospect = self.put_prospect(data.get("attributes", {}), notify=True)
        except ValueError as exc:
            return _Outcome(error_response(422, "Unprocessable Entity", str(exc)), False)
        return _Outcome(jsonapi_response(201, {"data": prospect.to_resource()}), True)

    def _update(self, request: Request, prospect_id: int) -> _Outcome:
        data = self._body(request)
        if isinstance(data, Response):
            return _Outcome(data, False)
        if data.get("type") != "prospect" or data.get("id") != prospect_id:
            detail = "data.type must be prospect and data.id the integer id in the path"
            return _Outcome(error_response(409, "Conflict", detail), False)
        prospect = self._prospects.get(prospect_id)
        if prospect is None:
            return _Outcome(_not_found("prospect", prospect_id), False)
        try:
            fields = validate_attributes(data.get("attributes", {}), what="data.attributes")
        except ValueError as exc:
            return _Outcome(error_response(422, "Unprocessable Entity", str(exc)), False)
        self._apply(prospect, fields, None, notify=True)
        return _Outcome(jsonapi_response(200, {"data": prospect.to_resource()}), True)

    def _subscribe(self, request: Request) -> _Outcome:
        data = self._body(request)
        if isinstance(data, Response):
            return _Outcome(data, False)
        attributes = data.get("attributes")
        if data.get("type") != "webhook" or not isinstance(attributes, dict):
            return _Outcome(error_response(409, "Conflict", "data.type must be webhook"),
                            False)
        problem = _subscription_problem(attributes)
        if problem:
            return _Outcome(error_response(422, "Unprocessable Entity", problem), False)
        subscription = Subscription(
            id=self._next_subscription, resource=attributes.get("resource", "*"),
            action=attributes.get("action", "*"), url=attributes["url"],
            secret=attributes.get("secret") or secrets.token_hex(16),
            payload_version=attributes.get("payloadVersion", 1),
            cleanup_token=secrets.token_urlsafe(24), created_us=self.clock(),
        )
        self._next_subscription += 1
        self._subscriptions[subscription.id] = subscription
        doc = subscription.to_resource(reveal_cleanup_token=True)
        return _Outcome(jsonapi_response(201, {"data": doc}), True)

    def _webhook_member(self, request: Request, webhook_id: int) -> _Outcome:
        found = self._subscriptions.get(webhook_id)
        if request.method == "GET":
            if found is None:
                return _Outcome(_not_found("webhook", webhook_id), False)
            return _Outcome(jsonapi_response(200, {"data": found.to_resource()}), False)
        if request.method == "DELETE":
            if found is None:
                return _Outcome(_not_found("webhook", webhook_id), False)
            del self._subscriptions[webhook_id]
            return _Outcome(jsonapi_response(204, None), True)
        return _Outcome(_not_allowed("GET, DELETE"), False)

    def cleanup_delete(self, webhook_id: int, cleanup_token: str) -> bool:
        """Delete a subscription by its cleanup token alone (no bearer token: the install
        that created it may be gone). False when the id or token does not match."""
        found = self._subscriptions.get(webhook_id)
        if found is None or not hmac.compare_digest(found.cleanup_token, cleanup_token):
            return False
        del self._subscriptions[webhook_id]
        return True

    def _other_record(self, request: Request, record_id: str) -> Response:
        prospect_id = _member_id(request.path, PROSPECTS_PATH)
        found = self._prospects.get(prospect_id) if prospect_id is not None else None
        doc = found.to_resource() if found is not None else {"type": "prospect",
                                                              "attributes": {}}
        other = int(record_id) if record_id.isdigit() else record_id
        return jsonapi_response(200, {"data": {**doc, "id": other}})


def _payload(version: int, change: Change, event_name: str, delivered_at: str) -> bytes:
    """A delivery body. Version 2 is JSON:API: ``data`` with only the changed attributes,
    ``meta.eventName`` and ``meta.deliveredAt``, ``beforeUpdate`` with the prior values.
    Version 1 (legacy) is the flat resource; integrationd subscribes with version 2."""
    data: dict[str, Any] = {"type": "prospect", "id": change.prospect_id,
                            "attributes": dict(change.attributes), "relationships": {}}
    doc: dict[str, Any]
    if version == 2:
        doc = {"data": data, "meta": {"eventName": event_name, "deliveredAt": delivered_at}}
        if change.action == "updated":
            doc["beforeUpdate"] = dict(change.before)
    else:
        doc = {"resource": "prospect", "action": change.action, "id": change.prospect_id,
               "attributes": dict(change.attributes)}
    return json.dumps(doc, separators=(",", ":")).encode()


def _subscription_problem(attributes: Mapping[str, Any]) -> str:
    url = attributes.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return "url must be an http(s) URL"
    if attributes.get("resource", "*") not in WEBHOOK_RESOURCES:
        return f"resource must be one of {sorted(WEBHOOK_RESOURCES)}"
    if attributes.get("action", "*") not in WEBHOOK_ACTIONS:
        return f"action must be one of {sorted(WEBHOOK_ACTIONS)}"
    version = attributes.get("payloadVersion", 1)
    if isinstance(version, bool) or version not in PAYLOAD_VERSIONS:
        return "payloadVersion must be 1 or 2"
    secret = attributes.get("secret")
    if secret is not None and (not isinstance(secret, str) or len(secret) > 255):
        return "secret must be a string of at most 255 characters"
    return ""


def _member_id(path: str, collection: str) -> int | None:
    if not path.startswith(collection + "/"):
        return None
    rest = path[len(collection) + 1:]
    return int(rest) if rest.isdigit() and not rest.startswith("0") else None


def _not_found(kind: str, record_id: int) -> Response:
    return error_response(404, "Not Found", f"{kind} {record_id} not found")


def _not_allowed(allow: str) -> Response:
    return error_response(405, "Method Not Allowed", "method not allowed",
                          (("allow", allow),))
