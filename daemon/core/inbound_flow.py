"""The inbound Flow's decisions (pure): what one ``inbound_apply`` claim does next.

Theory of operation
-------------------
The shell (``daemon/services/inbound_flow.py``) reads what one change needs (the L2 object
binding, the RemoteLink of the remote record, the record's watermarks) into a
:class:`FlowView` and asks :func:`decide` for one :class:`Step`; it performs the step and,
for the read-only steps (:class:`Hydrate`, :class:`Lookup`), asks again with what it
learned. The rules, in order:

1. Binding drift (the change names a binding the pinned Catalog does not hold as it was,
   or the object binding for its resource is gone) fails closed.
2. ``destroyed`` retires the active RemoteLink and records the observed deletion; the local
   Lead is never deleted. With no link there is nothing to retire (the deletion is still
   recorded).
3. A change older than an observed deletion of the record is stale.
4. The change needs the provider's ``updatedAt``: a change without one hydrates (a GET);
   still none is an error.
5. No link: the L2 ``match`` pair finds the local record (a GET hydrates a partial payload
   that lacks the match field; the Runtime is asked for Leads with that value): exactly
   one adopts it; none, several, or no match rule fail closed. Adoption itself can fail
   (the Lead is linked to another record: conflicting locators), which the shell turns
   into a fail-closed item too.
6. Only declared inbound-owned fields that the change (or the hydrated snapshot) carries
   are sent; a field absent from a partial payload is never blanked; a field whose applied
   watermark is as new or newer than this change is left alone (never regress).
7. The Runtime mutation's key is a digest of the link, the fields and the remote time, so
   the same observation from a webhook and from reconciliation is one mutation.

"Fail closed" is a dead WorkItem with a stable code, the operator's reconciliation item
(visible in the DLQ; an operator repairs the identity, then replays).
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from daemon.core.canonical import canonical_bytes
from daemon.core.inbound_change import InboundChange

# Stable codes of fail-closed outcomes (the dead item's failure class).
BINDING_DRIFT: Final = "binding_drift"
AMBIGUOUS_IDENTITY: Final = "ambiguous_identity"
NO_LOCAL_MATCH: Final = "no_local_match"
SEVERAL_LOCAL_MATCHES: Final = "several_local_matches"
CONFLICTING_LOCATOR: Final = "conflicting_locator"
NO_REMOTE_TIME: Final = "no_remote_time"
BAD_VALUE: Final = "bad_inbound_value"
FAIL_CLOSED_CODES: Final = frozenset({
    BINDING_DRIFT, AMBIGUOUS_IDENTITY, NO_LOCAL_MATCH, SEVERAL_LOCAL_MATCHES,
    CONFLICTING_LOCATOR, NO_REMOTE_TIME, BAD_VALUE,
})

_STAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})")


def remote_time_ns(text: str | None) -> int | None:
    """An ISO 8601 provider time as integer nanoseconds since the epoch, at the full
    precision the text carries (up to nanoseconds; no float anywhere); None if not one."""
    if not isinstance(text, str):
        return None
    m = _STAMP.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        moment = datetime.datetime(year, month, day, hour, minute, second, tzinfo=datetime.UTC)
    except ValueError:
        return None
    zone = m.group(8)
    offset_s = 0
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        offset_s = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    whole = int(moment.timestamp()) - offset_s
    fraction = (m.group(7) or "").ljust(9, "0")
    return whole * 1_000_000_000 + int(fraction)


@attrs.frozen(kw_only=True)
class LinkFacts:
    link_key: str
    local_id: str
    generation: int
    remote_id: str | None


@attrs.frozen(kw_only=True)
class Snapshot:
    """A hydrated record (``absent``: the provider answered that it does not exist)."""

    absent: bool = False
    remote_id: str | None = None
    attributes: Mapping[str, Any] = attrs.field(factory=dict)
    updated_at: str | None = None


@attrs.frozen(kw_only=True)
class FlowView:
    change: InboundChange
    # The drift the shell found (binding gone, provider or org changed), or None.
    drift: str | None = None
    # Inbound-owned fields only: remote attribute -> local field.
    inbound: Mapping[str, str] = attrs.field(factory=dict)
    match: tuple[str, str] | None = None  # (remote attribute, local field)
    updated_at_attribute: str = "updatedAt"
    link: LinkFacts | None = None
    stamps: Mapping[str, int] = attrs.field(factory=dict)  # remote field -> applied ns
    deleted_ns: int | None = None
    snapshot: Snapshot | None = None
    candidates: tuple[str, ...] | None = None  # local ids found by the match (None: not asked)


@attrs.frozen
class FailClosed:
    code: str
    sentence: str


@attrs.frozen
class Hydrate:
    """GET the record (the change is partial and the Flow needs more of it)."""


@attrs.frozen
class Lookup:
    local_field: str
    values: tuple[str, ...]


@attrs.frozen
class Adopt:
    local_id: str


@attrs.frozen
class Apply:
    local_id: str
    fields: Mapping[str, str | None]  # local field -> value
    stamps: Mapping[str, int]  # remote field -> this change's time (ns)
    mutation_key: str
    updated_ns: int


@attrs.frozen
class Retire:
    link: LinkFacts
    observed_ns: int | None


@attrs.frozen
class Nothing:
    reason: str
    deleted_ns: int | None = None  # a deletion to record although nothing else happens


Step = FailClosed | Hydrate | Lookup | Adopt | Apply | Retire | Nothing


def _attributes(view: FlowView) -> Mapping[str, Any]:
    """What this change knows: its own attributes, completed (never overridden) by a
    hydrated snapshot of the same record."""
    if view.snapshot is None or view.snapshot.absent:
        return view.change.attributes
    return {**view.snapshot.attributes, **view.change.attributes}


def _updated_at(view: FlowView) -> str | None:
    change = view.change
    text = change.remote_updated_at or change.attributes.get(view.updated_at_attribute)
    if text is None and view.snapshot is not None and not view.snapshot.absent:
        text = view.snapshot.updated_at
    return text if isinstance(text, str) else None


def _match_values(value: Any) -> tuple[str, ...] | None:
    """A match attribute's values: a string, or a list of strings (Prospect ``emails``)."""
    if isinstance(value, str) and value:
        return (value,)
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
        return tuple(sorted(set(value)))
    return None


def mutation_key(link_key: str, fields: Mapping[str, str | None], updated_at: str) -> str:
    digest = hashlib.sha256(canonical_bytes({
        "link": link_key, "fields": dict(fields), "remote_updated_at": updated_at,
    })).hexdigest()
    return f"inb:{digest[:48]}"


def decide(view: FlowView) -> Step:
    change = view.change
    if view.drift is not None:
        return FailClosed(BINDING_DRIFT, view.drift)
    updated_text = _updated_at(view)
    updated_ns = remote_time_ns(updated_text)
    if change.kind == "destroyed" or (view.snapshot is not None and view.snapshot.absent):
        if view.link is None:
            return Nothing("the remote record was destroyed; no link to retire",
                           deleted_ns=updated_ns)
        return Retire(view.link, updated_ns)
    if updated_text is not None and updated_ns is None:
        return FailClosed(NO_REMOTE_TIME, f"the remote time {updated_text[:40]!r} is not an"
                          " ISO 8601 time")
    if updated_ns is None:
        if view.snapshot is None:
            return Hydrate()
        return FailClosed(NO_REMOTE_TIME, "neither the change nor the record carries"
                          f" {view.updated_at_attribute}")
    if view.deleted_ns is not None and updated_ns <= view.deleted_ns:
        return Nothing("older than the observed deletion of the record")
    snapshot = view.snapshot
    if snapshot is not None and snapshot.remote_id not in (None, change.resource_id):
        return FailClosed(CONFLICTING_LOCATOR, f"the read of {change.resource_type}"
                          f" {change.resource_id} answered for another record")
    attributes = _attributes(view)
    link = view.link
    if link is None:
        if view.match is None:
            return FailClosed(AMBIGUOUS_IDENTITY, f"{change.resource_type}"
                              f" {change.resource_id} has no link and the binding declares"
                              " no match rule")
        remote_field, local_field = view.match
        values = _match_values(attributes.get(remote_field))
        if values is None:
            if snapshot is None:
                return Hydrate()
            return FailClosed(AMBIGUOUS_IDENTITY, f"{change.resource_type}"
                              f" {change.resource_id} has no link and no {remote_field} to"
                              " match by")
        if view.candidates is None:
            return Lookup(local_field, values)
        if not view.candidates:
            return FailClosed(NO_LOCAL_MATCH, f"no local record has this {local_field}")
        if len(view.candidates) > 1:
            return FailClosed(SEVERAL_LOCAL_MATCHES, f"{len(view.candidates)} local records"
                              f" have this {local_field}")
        return Adopt(view.candidates[0])
    if link.remote_id not in (None, change.resource_id):
        return FailClosed(CONFLICTING_LOCATOR, "the link names another remote record")
    fields: dict[str, str | None] = {}
    stamps: dict[str, int] = {}
    for remote_field, local_field in sorted(view.inbound.items()):
        if remote_field not in attributes:
            continue  # a partial change never blanks what it did not carry
        if view.stamps.get(remote_field, -1) >= updated_ns:
            continue  # a change as new or newer already applied this field
        value = attributes[remote_field]
        if value is not None and not isinstance(value, str):
            return FailClosed(BAD_VALUE, f"{remote_field} is not text")
        fields[local_field] = value
        stamps[remote_field] = updated_ns
    if not fields:
        return Nothing("no inbound-owned field is newer than what was applied")
    assert updated_text is not None
    return Apply(link.local_id, fields, stamps, mutation_key(link.link_key, fields,
                                                             updated_text), updated_ns)


def lost_webhook(origin: str, updated_ns: int | None, webhook_seen_ns: int) -> bool:
    """Reconciliation saw a version of the record that no webhook delivered."""
    return origin == "reconcile" and updated_ns is not None and updated_ns > webhook_seen_ns
