"""The Outreach simulator's values and in-memory state: Prospects, webhook subscriptions,
the rate-limit window, the cursor codec, and the journals of requests and deliveries.

Pure: no trio, no sockets. ``simulator.py`` decides what happens to a request; this module
holds what the provider knows.

Timestamps are integers of microseconds since the epoch inside, and ISO 8601 text with
millisecond precision and a ``Z`` suffix on the wire (Outreach's shape). Every ordering
the list endpoint offers is by ``(updatedAt, id)``, with ``updatedAt`` compared at the
precision it is rendered in, so two Prospects bulk-updated to one ``updatedAt`` sort by id.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

import attrs

Attributes = dict[str, Any]

# The Prospect attributes this simulator knows; a PATCH naming another one is a 422,
# as Outreach answers for an unknown attribute.
PROSPECT_ATTRIBUTES: Final = frozenset({
    "firstName", "lastName", "title", "company", "emails", "phone", "stage",
    "addressCity", "addressCountry", "tags", "owner",
    # A number with a fraction, as Outreach's scores are (integrationd keeps its exact text).
    "engagedScore",
})
# Read-only attributes the provider maintains.
READ_ONLY_ATTRIBUTES: Final = frozenset({"createdAt", "updatedAt"})
WEBHOOK_ACTIONS: Final = frozenset({"*", "created", "updated", "destroyed"})
WEBHOOK_RESOURCES: Final = frozenset({"*", "prospect"})
PAYLOAD_VERSIONS: Final = frozenset({1, 2})


def now_us() -> int:
    return int(time.time() * 1_000_000)


def iso8601(us: int) -> str:
    """Outreach's timestamp shape: UTC, millisecond precision, ``Z`` suffix."""
    moment = datetime.fromtimestamp(us // 1_000_000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{(us // 1000) % 1000:03d}Z"


def parse_iso8601(text: str) -> int:
    """Microseconds of an ISO 8601 UTC timestamp; ``ValueError`` when it is not one."""
    if not text.endswith("Z"):
        raise ValueError(f"timestamp {text!r} must be UTC with a Z suffix")
    moment = datetime.fromisoformat(text[:-1] + "+00:00")
    if moment.tzinfo is None:  # pragma: no cover - the suffix above makes it aware
        raise ValueError(f"timestamp {text!r} has no zone")
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def wire_precision(us: int) -> int:
    """The value as the wire shows it (milliseconds): what a filter or cursor compares."""
    return us - us % 1000


@attrs.define(eq=False)
class Prospect:
    """A Prospect as the provider stores it; mutated in place by PATCH and the control API."""

    id: int
    attributes: Attributes
    created_us: int
    updated_us: int

    def to_resource(self) -> dict[str, Any]:
        return {
            "type": "prospect",
            "id": self.id,
            "attributes": {
                **self.attributes,
                "createdAt": iso8601(self.created_us),
                "updatedAt": iso8601(self.updated_us),
            },
            "relationships": {},
            "links": {"self": f"/api/v2/prospects/{self.id}"},
        }

    def sort_key(self) -> tuple[int, int]:
        return (wire_precision(self.updated_us), self.id)


@attrs.define(eq=False)
class Subscription:
    """One webhook subscription. ``secret`` and ``cleanup_token`` never leave in a GET."""

    id: int
    resource: str
    action: str
    url: str
    secret: str = attrs.field(repr=False)
    payload_version: int
    cleanup_token: str = attrs.field(repr=False)
    active: bool = True
    created_us: int = 0

    def matches(self, resource: str, action: str) -> bool:
        return (self.active and self.resource in ("*", resource)
                and self.action in ("*", action))

    def to_resource(self, *, reveal_cleanup_token: bool = False) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "resource": self.resource,
            "action": self.action,
            "url": self.url,
            "payloadVersion": self.payload_version,
            "active": self.active,
            "createdAt": iso8601(self.created_us),
        }
        doc: dict[str, Any] = {"type": "webhook", "id": self.id, "attributes": attributes}
        if reveal_cleanup_token:
            # Only the create answer carries it: the one moment a client can store it.
            doc["meta"] = {"cleanupToken": self.cleanup_token}
        return doc


@attrs.frozen
class Change:
    """One change of one Prospect, as the webhook sender describes it."""

    action: str  # created | updated | destroyed
    prospect_id: int
    attributes: Attributes  # created: all; updated: the changed ones; destroyed: none
    before: Attributes  # updated: the prior values of the changed attributes


@attrs.frozen
class RequestRecord:
    """One provider-API request as the simulator saw it. Never holds credentials."""

    seq: int
    method: str
    path: str
    query: str
    status: int | None  # None: the connection was reset instead of answered
    applied: bool
    body_sha256: str
    received_at: float

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class DeliveryRecord:
    """One webhook delivery attempt (or a deliberate drop). Holds no secret, no body."""

    seq: int
    subscription_id: int
    event_name: str
    prospect_id: int
    attempt: int  # 1-based; a redelivery after a network failure is attempt 2, 3, 4
    request_id: str  # the Outreach-Webhook-ID header: new for every attempt
    body_sha256: str
    # "delivered" (any HTTP status), "network_error", "dropped", or "interrupted" (the
    # sender stopped with the request in flight: it may have arrived, no answer was read)
    outcome: str
    status: int | None

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define(eq=False)
class RateWindow:
    """A fixed window of ``limit`` requests per ``window_us`` per token (Outreach counts
    per user per hour)."""

    limit: int = 10_000
    window_us: int = 3_600_000_000
    _used: dict[str, tuple[int, int]] = attrs.field(factory=dict)  # token -> (start, used)

    def take(self, token: str, now: int) -> tuple[bool, int, int]:
        """(allowed, remaining, microseconds until reset) after counting one request."""
        start, used = self._used.get(token, (now, 0))
        if now - start >= self.window_us:
            start, used = now, 0
        allowed = used < self.limit
        if allowed:
            used += 1
        self._used[token] = (start, used)
        return allowed, max(self.limit - used, 0), start + self.window_us - now

    def clear(self) -> None:
        self._used.clear()


def encode_cursor(updated_us: int, prospect_id: int) -> str:
    """The opaque ``page[after]`` cursor: the last row's sort key."""
    raw = json.dumps([wire_precision(updated_us), prospect_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[int, int]:
    """``ValueError`` for anything this simulator did not hand out."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = json.loads(raw)
    except (ValueError, TypeError):
        raise ValueError("page[after] is not a cursor this API issued") from None
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ValueError("page[after] is not a cursor this API issued")
    return value[0], value[1]


def parse_range(text: str) -> tuple[int | None, int | None]:
    """``X..inf``, ``neg_inf..Y`` or ``X..Y`` (inclusive) into microseconds; None = open."""
    low, sep, high = text.partition("..")
    if not sep:
        raise ValueError("filter[updatedAt] must be a range such as 2024-01-01T00:00:00Z..inf")
    lo = None if low in ("", "neg_inf") else parse_iso8601(low)
    hi = None if high in ("", "inf") else parse_iso8601(high)
    return lo, hi


def validate_attributes(doc: object, *, what: str) -> Attributes:
    """A JSON object of known, writable Prospect attributes; ``ValueError`` names the key."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"{what} must be a JSON object")
    for name in doc:
        if name in READ_ONLY_ATTRIBUTES:
            raise ValueError(f"{what}: {name} is read-only")
        if name not in PROSPECT_ATTRIBUTES:
            raise ValueError(f"{what}: unknown attribute {name}")
    return dict(doc)
