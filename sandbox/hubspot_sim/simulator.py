"""HubSpotSimulator: the provider API, fault injection and the request journal.

Every provider request goes through :meth:`HubSpotSimulator.handle` in four steps:

1. take the first armed fault that matches it (before anything else: faults model
   the network and the provider's front door, which act before auth);
2. act on the fault, or handle the request normally;
3. append one :class:`RequestRecord` to the journal;
4. return a response, or ``ABORT`` for the HTTP layer to reset the connection.

Steps 2 to 4 have no await between a state change and its journal record (the
only await is a latency fault's sleep, which comes first), so concurrent
connections can never see a change that the journal does not show.

Order of checks for a normal request: body too large (413), auth (401), route
(404/405), content type (415), body shape (400), contact exists (404).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import time
from collections import Counter
from typing import Any, Final
from urllib.parse import parse_qsl

import attrs
import trio

from sandbox.h11_server import ABORT, Abort, H11Server, Request, Response
from sandbox.hubspot_sim.control import handle_control
from sandbox.hubspot_sim.model import (
    Contact,
    Fault,
    FaultQueue,
    Properties,
    RequestRecord,
    now_ms,
    parse_properties,
)
from sandbox.hubspot_sim.responses import error_response, json_response

CONTACTS_PATH: Final = "/crm/v3/objects/contacts"
CONTROL_PREFIX: Final = "/_sim/"
MAX_BODY: Final = 64 * 1024
# The rate-limit window the headers report, and how long arrivals are kept for it (a
# request delayed by an injected latency is counted at the time it arrived).
RATE_INTERVAL_S: Final = 10.0
ARRIVALS_KEPT_S: Final = 60.0

@attrs.frozen
class _Outcome:
    response: Response
    contact_id: str | None
    applied: bool


@attrs.define(eq=False)
class HubSpotSimulator:
    """An in-memory HubSpot contacts API on a real loopback HTTP/1.1 server.

    ``tokens`` are the valid bearer tokens (hidden from ``repr``). ``requests``
    is the journal of provider requests, oldest first.
    """

    tokens: set[str] = attrs.field(repr=False)
    max_body: int = MAX_BODY
    requests: list[RequestRecord] = attrs.field(factory=list, init=False)
    _contacts: dict[str, Contact] = attrs.field(factory=dict, init=False)
    _patches: Counter[str] = attrs.field(factory=Counter, init=False)
    _faults: FaultQueue = attrs.field(factory=FaultQueue, init=False)
    _next_id: int = attrs.field(default=1, init=False)
    _server: H11Server | None = attrs.field(default=None, init=False)
    # HubSpot's rate-limit headers: every provider answer reports how many of the app's
    # `rate_limit` requests per 10 s remain, counting this simulator's own arrivals and
    # `other_client_requests` (another client of the same app, which integrationd's
    # book cannot see).
    rate_limit: int = 100
    other_client_requests: int = 0
    # Arrival times of the journal's requests, sorted, for the rate-limit headers (counted
    # with two bisections: scanning the journal made every answer cost O(requests/min)).
    _arrivals: list[float] = attrs.field(factory=list, init=False)
    # Honour the Idempotency-Key header on PATCH, as a provider whose L1 declares a
    # replay proof does (HubSpot itself ignores the header: off by default, as the
    # shipped L1 says). A PATCH repeating a key that was applied within
    # `idempotency_retention_s` is answered as the first one was and applies nothing.
    honour_idempotency_keys: bool = False
    idempotency_retention_s: float = 86_400.0
    _applied_keys: dict[str, tuple[float, Response]] = attrs.field(factory=dict, init=False)

    async def run(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve on ``host:port`` (0 picks a port) until cancelled; report the port when ready."""
        self._server = H11Server(self.handle, max_body=self.max_body)
        await self._server.run(host, port, task_status=task_status)

    @property
    def connections_accepted(self) -> int:
        """TCP connections accepted so far (keep-alive reuses one)."""
        return 0 if self._server is None else self._server.connections_accepted

    # ---- state, for tests in the same process (the control API wraps these) ----

    def add_contact(self, contact_id: str, **properties: str | None) -> None:
        """Create or overwrite a contact with exactly ``properties``."""
        self.put_contact(contact_id, properties)

    def put_contact(self, contact_id: str, properties: Properties, *,
                    modified_ms: int | None = None) -> Contact:
        """Create or overwrite a contact; ``modified_ms`` backdates its creation and last
        modification (a record that existed long before the test, as real ones do)."""
        if not contact_id or "/" in contact_id:
            raise ValueError("a contact id is a non-empty string without '/'")
        stamp = now_ms() if modified_ms is None else modified_ms
        contact = Contact(contact_id, dict(properties), stamp, stamp)
        self._contacts[contact_id] = contact
        if contact_id.isdigit():
            # Ids the simulator hands out on POST never collide with seeded ones.
            self._next_id = max(self._next_id, int(contact_id) + 1)
        return contact

    def change_contact(self, contact_id: str, **properties: str | None) -> None:
        """Another writer (a person in HubSpot, a workflow) changes a contact: its
        properties and its last-modified time, not ``patches_applied``."""
        contact = self._contacts.get(contact_id)
        if contact is None:
            raise KeyError(contact_id)
        contact.apply(properties)

    def contact(self, contact_id: str) -> dict[str, Any] | None:
        """The raw stored state of a contact plus ``patches_applied``; None if unknown."""
        contact = self._contacts.get(contact_id)
        if contact is None:
            return None
        return {**contact.to_json(), "patches_applied": self._patches[contact_id]}

    def patches_applied(self, contact_id: str) -> int:
        """How many PATCHes changed this contact (survives re-seeding; cleared by reset)."""
        return self._patches[contact_id]

    def inject(self, fault: Fault) -> None:
        """Arm ``fault`` behind any already armed ones."""
        self._faults.push(fault)

    def clear_faults(self) -> int:
        """Disarm every fault; return how many were armed."""
        return self._faults.clear()

    def pending_faults(self) -> list[tuple[Fault, int]]:
        """Armed faults in order, with how many requests each will still take."""
        return self._faults.pending()

    def reset(self) -> None:
        """Forget contacts, faults, the journal and patch counts."""
        self._contacts.clear()
        self._patches.clear()
        self._faults.clear()
        self.requests.clear()
        self._arrivals.clear()
        self._next_id = 1

    # ---- HTTP ----

    async def handle(self, request: Request) -> Response | Abort:
        """The HTTP handler: control requests, or provider requests with faults."""
        if request.path.startswith(CONTROL_PREFIX):
            return handle_control(self, request)
        received_at = time.time()  # before any injected latency
        fault = self._faults.take(request.method, request.path)
        if fault is None:
            outcome = self._provider(request)
        elif fault.mode == "latency":
            await trio.sleep(fault.latency_ms / 1000)
            outcome = self._provider(request)
        elif fault.mode == "status":
            response = error_response(fault.status, "injected fault")
            outcome = _Outcome(response, _contact_id(request.path), applied=False)
        elif fault.mode == "rate_limit":
            response = error_response(
                429,
                "You have reached your secondly limit.",
                (("retry-after", str(fault.retry_after_s)),),
                policyName="SECONDLY",
            )
            outcome = _Outcome(response, _contact_id(request.path), applied=False)
        elif fault.mode == "other_record":
            outcome = self._other_record(request, fault)
        elif fault.mode == "reset_before":
            self._record(request, received_at, _contact_id(request.path), False, status=None)
            return ABORT
        else:  # reset_after: the provider does the work, the answer is lost
            outcome = self._provider(request)
            self._record(request, received_at, outcome.contact_id, outcome.applied, status=None)
            return ABORT
        self._record(
            request, received_at, outcome.contact_id, outcome.applied, outcome.response.status
        )
        return attrs.evolve(outcome.response, headers=(
            *outcome.response.headers, *self._rate_headers(received_at)))

    def _rate_headers(self, now: float) -> tuple[tuple[str, str], ...]:
        recent = (bisect.bisect_right(self._arrivals, now)
                  - bisect.bisect_right(self._arrivals, now - RATE_INTERVAL_S))
        remaining = max(0, self.rate_limit - recent - self.other_client_requests)
        return (("x-hubspot-ratelimit-max", str(self.rate_limit)),
                ("x-hubspot-ratelimit-interval-milliseconds", str(int(RATE_INTERVAL_S * 1000))),
                ("x-hubspot-ratelimit-remaining", str(remaining)))

    def _arrive(self, received_at: float) -> None:
        """Keep the arrival times sorted (latency may reorder them a little, so each is
        inserted in place, near the end) and forget those past any window."""
        bisect.insort(self._arrivals, received_at)
        if self._arrivals[0] < received_at - 2 * ARRIVALS_KEPT_S:
            del self._arrivals[:bisect.bisect_left(self._arrivals, received_at - ARRIVALS_KEPT_S)]

    def _record(
        self,
        request: Request,
        received_at: float,
        contact_id: str | None,
        applied: bool,
        status: int | None,
    ) -> None:
        digest = "" if request.body_too_large else hashlib.sha256(request.body).hexdigest()
        self._arrive(received_at)
        self.requests.append(
            RequestRecord(
                seq=len(self.requests) + 1,
                method=request.method,
                path=request.path,
                contact_id=contact_id,
                applied=applied,
                status=status,
                idempotency_key=request.headers.get("idempotency-key"),
                body_sha256=digest,
                received_at=received_at,
            )
        )

    def _provider(self, request: Request) -> _Outcome:
        contact_id = _contact_id(request.path)
        if request.body_too_large:
            return _Outcome(
                error_response(413, f"request body is over {self.max_body} bytes"),
                contact_id,
                applied=False,
            )
        if not self._authorized(request):
            message = "Authentication credentials not found or invalid."
            return _Outcome(error_response(401, message), contact_id, applied=False)
        if request.path == CONTACTS_PATH:
            if request.method != "POST":
                return _Outcome(_not_allowed("POST"), None, applied=False)
            return self._create(request)
        if contact_id is None:
            return _Outcome(error_response(404, "no such route"), None, applied=False)
        if request.method == "GET":
            return _Outcome(self._read(request, contact_id), contact_id, applied=False)
        if request.method == "PATCH":
            return self._update_once(request, contact_id)
        return _Outcome(_not_allowed("GET, PATCH"), contact_id, applied=False)

    def _authorized(self, request: Request) -> bool:
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and token.strip() in self.tokens

    def _read(self, request: Request, contact_id: str) -> Response:
        contact = self._contacts.get(contact_id)
        if contact is None:
            return error_response(404, f"Object not found. objectId={contact_id}")
        names: list[str] | None = None
        if request.query:
            # HubSpot takes both ?properties=a,b and ?properties=a&properties=b.
            wanted = [v for k, v in parse_qsl(request.query) if k == "properties"]
            if wanted:
                names = [n for v in wanted for n in v.split(",") if n]
        return json_response(200, contact.to_json(names))

    def _update_once(self, request: Request, contact_id: str) -> _Outcome:
        """A PATCH, once per idempotency key when keys are honoured."""
        key = request.headers.get("idempotency-key") if self.honour_idempotency_keys else None
        if key:
            seen = self._applied_keys.get(key)
            if seen is not None and time.time() - seen[0] < self.idempotency_retention_s:
                return _Outcome(seen[1], contact_id, applied=False)
        outcome = self._update(request, contact_id)
        if key and outcome.applied:
            self._applied_keys[key] = (time.time(), outcome.response)
        return outcome

    def _update(self, request: Request, contact_id: str) -> _Outcome:
        changes = _json_properties(request)
        if isinstance(changes, Response):
            return _Outcome(changes, contact_id, applied=False)
        contact = self._contacts.get(contact_id)
        if contact is None:
            response = error_response(404, f"Object not found. objectId={contact_id}")
            return _Outcome(response, contact_id, applied=False)
        contact.apply(changes)
        self._patches[contact_id] += 1
        return _Outcome(json_response(200, contact.to_json()), contact_id, applied=True)

    def _other_record(self, request: Request, fault: Fault) -> _Outcome:
        """A 200 that names another record: the requested contact's body (unchanged,
        nothing applied) under ``fault.record_id``, as a misrouting gateway would."""
        contact_id = _contact_id(request.path)
        contact = self._contacts.get(contact_id) if contact_id is not None else None
        doc = contact.to_json() if contact is not None else {"properties": {}}
        return _Outcome(json_response(200, {**doc, "id": fault.record_id}), contact_id,
                        applied=False)

    def _create(self, request: Request) -> _Outcome:
        properties = _json_properties(request)
        if isinstance(properties, Response):
            return _Outcome(properties, None, applied=False)
        while str(self._next_id) in self._contacts:
            self._next_id += 1
        contact = self.put_contact(str(self._next_id), properties)
        return _Outcome(json_response(201, contact.to_json()), contact.id, applied=True)


def _contact_id(path: str) -> str | None:
    """The ``{id}`` of ``/crm/v3/objects/contacts/{id}``, or None for any other path."""
    if not path.startswith(CONTACTS_PATH + "/"):
        return None
    rest = path[len(CONTACTS_PATH) + 1 :]
    return rest if rest and "/" not in rest else None


def _not_allowed(allow: str) -> Response:
    return error_response(405, "method not allowed", (("allow", allow),))


def _json_properties(request: Request) -> Properties | Response:
    """The validated properties of a JSON write body, or the error response to send."""
    content_type = request.headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() != "application/json":
        return error_response(415, "Content-Type must be application/json")
    try:
        doc = json.loads(request.body)
    except (ValueError, RecursionError):  # ValueError covers bad JSON and bad UTF-8
        return error_response(400, "Invalid input JSON on line 1")
    try:
        return parse_properties(doc)
    except ValueError as exc:
        return error_response(400, f"Property values were not valid: {exc}")
