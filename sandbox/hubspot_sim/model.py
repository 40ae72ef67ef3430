"""The simulator's values and in-memory state: contacts, faults, the request journal.

Pure: no trio, no sockets. The HTTP layer (``simulator.py``) decides *what*
happens to a request; this module holds what the provider knows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal, cast

import attrs

FaultMode = Literal["latency", "status", "rate_limit", "reset_before", "reset_after",
                    "other_record"]
FAULT_MODES: Final[frozenset[str]] = frozenset(
    ("latency", "status", "rate_limit", "reset_before", "reset_after", "other_record")
)

Properties = dict[str, str | None]


def now_ms() -> int:
    return int(time.time() * 1000)


def iso8601(ms: int) -> str:
    """HubSpot's timestamp shape: UTC, millisecond precision, ``Z`` suffix."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _positive(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


def _not_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value}")


def _error_status(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 400 <= value <= 599:
        raise ValueError(f"{attribute.name} must be an HTTP error status (400-599), got {value}")


def _upper_or_none(method: str | None) -> str | None:
    # HTTP methods arrive upper-case; "patch" from a person should still match.
    return method.upper() if method else None


_FAULT_INT_FIELDS: Final = ("count", "latency_ms", "status", "retry_after_s")


@attrs.frozen
class Fault:
    """One injected misbehaviour, taken by the first ``count`` matching provider requests.

    A request matches when ``method`` is None or equal to its method, and its
    path starts with ``path_prefix``. Control requests (``/_sim/...``) never match.
    """

    mode: FaultMode = attrs.field(validator=attrs.validators.in_(FAULT_MODES))
    method: str | None = attrs.field(default=None, converter=_upper_or_none)
    path_prefix: str = "/crm/"
    count: int = attrs.field(default=1, validator=_positive)
    latency_ms: int = attrs.field(default=0, validator=_not_negative)
    status: int = attrs.field(default=503, validator=_error_status)
    retry_after_s: int = attrs.field(default=1, validator=_not_negative)
    # other_record: the id the 200 names instead of the requested contact's.
    record_id: str = "999999999"

    @classmethod
    def from_json(cls, doc: object) -> Fault:
        """Build a fault from decoded JSON (the control API); ``ValueError`` says what is wrong."""
        if not isinstance(doc, dict):
            raise ValueError("a fault is a JSON object")
        unknown = set(doc) - {f.name for f in attrs.fields(cls)}
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        mode = doc.get("mode")
        if not isinstance(mode, str) or mode not in FAULT_MODES:
            raise ValueError(f"mode must be one of {sorted(FAULT_MODES)}")
        method = doc.get("method")
        if method is not None and not isinstance(method, str):
            raise ValueError("method must be a string or null")
        prefix = doc.get("path_prefix", "/crm/")
        if not isinstance(prefix, str):
            raise ValueError("path_prefix must be a string")
        record_id = doc.get("record_id", "999999999")
        if not isinstance(record_id, str) or not record_id:
            raise ValueError("record_id must be a non-empty string")
        ints: dict[str, int] = {}
        for name in _FAULT_INT_FIELDS:
            if name in doc:
                value = doc[name]
                # bool is an int subclass; `true` is never a sensible count or status.
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError(f"{name} must be an integer")
                ints[name] = value
        return cls(
            mode=cast(FaultMode, mode),
            method=method,
            path_prefix=prefix,
            record_id=record_id,
            **ints,
        )

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method == method) and path.startswith(
            self.path_prefix
        )


@attrs.define(eq=False)
class _Armed:
    fault: Fault
    remaining: int


@attrs.define(eq=False)
class FaultQueue:
    """FIFO of armed faults; each request takes one shot from the first fault it matches."""

    _armed: list[_Armed] = attrs.field(factory=list)

    def push(self, fault: Fault) -> None:
        self._armed.append(_Armed(fault, fault.count))

    def take(self, method: str, path: str) -> Fault | None:
        if not self._armed:  # the common case under load: nothing to scan
            return None
        for index, armed in enumerate(self._armed):
            if armed.fault.matches(method, path):
                armed.remaining -= 1
                if armed.remaining == 0:
                    del self._armed[index]
                return armed.fault
        return None

    def clear(self) -> int:
        cleared = len(self._armed)
        self._armed.clear()
        return cleared

    def pending(self) -> list[tuple[Fault, int]]:
        """Armed faults in queue order, each with the number of requests it will still take."""
        return [(armed.fault, armed.remaining) for armed in self._armed]


@attrs.frozen
class RequestRecord:
    """One provider-API request as the simulator saw it. Never holds credentials.

    ``seq`` is the record's 1-based position in the journal (records are appended
    when the request is finished); ``status`` is None when the connection was reset
    instead of answered; ``applied`` says whether the request changed state.
    ``body_sha256`` is empty when the body was over the size limit and not kept.
    """

    seq: int
    method: str
    path: str
    contact_id: str | None
    applied: bool
    status: int | None
    idempotency_key: str | None
    body_sha256: str
    received_at: float  # epoch seconds, when the whole request had been read

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define(eq=False)
class Contact:
    """A contact as the provider stores it; mutated in place by PATCH."""

    id: str
    properties: Properties
    created_ms: int
    updated_ms: int
    # Formatted once per change rather than once per response: strftime is a
    # visible share of a request's cost at benchmark rates.
    _created_at: str = attrs.field(init=False)
    _updated_at: str = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._created_at = iso8601(self.created_ms)
        self._updated_at = iso8601(self.updated_ms)

    def apply(self, changes: Mapping[str, str | None]) -> None:
        self.properties.update(changes)
        # Strictly increasing, so two PATCHes within one millisecond still differ.
        self.updated_ms = max(now_ms(), self.updated_ms + 1)
        self._updated_at = iso8601(self.updated_ms)

    def to_json(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        if names is None:
            properties: Properties = dict(self.properties)
        else:
            properties = {name: self.properties.get(name) for name in names}
        return {
            "id": self.id,
            "properties": properties,
            "createdAt": self._created_at,
            "updatedAt": self._updated_at,
            "archived": False,
        }


def parse_properties(doc: object) -> Properties:
    """Validate ``{"properties": {name: str | null}}``; ``ValueError`` says what is wrong."""
    if not isinstance(doc, dict) or set(doc) != {"properties"}:
        raise ValueError('body must be a JSON object with exactly one key, "properties"')
    properties = doc["properties"]
    if not isinstance(properties, dict):
        raise ValueError('"properties" must be a JSON object')
    for name, value in properties.items():
        if not name:
            raise ValueError("property names must be non-empty")
        if value is not None and not isinstance(value, str):
            raise ValueError(f"property {name!r} must be a string or null")
    return cast(Properties, properties)
