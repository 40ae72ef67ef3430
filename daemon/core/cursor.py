"""Cursor reconciliation's decisions (pure): which listed records one page produces, and
where the stream's ``(updatedAt, id)`` cursor moves.

Theory of operation
-------------------
A stream (one binding, one resource) is listed oldest first by the provider's
``updatedAt`` from ``since = cursor - overlap``. Every listed record at or before the
*horizon* (``now - safety_lag``: a change that recent may still have its webhook in
flight, and would be miscounted as a lost webhook) becomes one ``InboundChange`` of kind
``observed``; a record past the horizon ends the run (it is read again next run).

Nothing is filtered by the cursor itself: the overlap re-lists records already produced,
and each produces the same dedupe key ``inbound:reconcile:<stream>:<updatedAt>:<id>``, so
inserting it again is a no-op. That is why records sharing one ``updatedAt`` are neither
skipped (the next run starts at or before their time, whatever order the provider breaks
ties in, across page boundaries too) nor doubled (one key per record version). Times are
compared as integer nanoseconds, the full precision of the provider's text.

The cursor (the greatest ``(updatedAt, id)`` produced) is checkpointed in the same
transaction that inserts a page's items: a crash between fetching a page and that commit
loses nothing (the page is fetched again) and doubles nothing (the keys).

A repair (bounded: ``[from, to]``; full: from the beginning) produces kind ``observed`` with
origin ``repair`` and its own run id in the key, so it re-offers every record in the
period once more; the inbound Flow's watermarks keep it from regressing anything.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from daemon.core.inbound_change import InboundChange
from daemon.core.inbound_flow import remote_time_ns


class BadPage(ValueError):
    """A listed page that is not what the L1 definition says (names what is wrong)."""


@attrs.frozen(kw_only=True)
class Cursor:
    updated_ns: int
    updated_at: str  # the provider's own text of that time
    record_id: str

    def key(self) -> tuple[int, int, str]:
        return _order(self.updated_ns, self.record_id)


def _order(ns: int, record_id: str) -> tuple[int, int, str]:
    # Digit ids compare as numbers (shorter first), others as text after them.
    return (ns, len(record_id) if record_id.isdigit() else 1 << 30, record_id)


@attrs.frozen(kw_only=True)
class Listed:
    record_id: str
    updated_at: str
    updated_ns: int
    attributes: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class PagePlan:
    changes: tuple[InboundChange, ...]
    cursor: Cursor | None  # the new cursor (None: unchanged)
    done: bool  # a record past the horizon or past ``until`` was listed: stop here


@attrs.frozen(kw_only=True)
class Stream:
    provider: str
    binding: str
    resource: str
    resource_type: str

    @property
    def key(self) -> str:
        return f"{self.binding}:{self.resource}"


def iso_from_ns(ns: int) -> str:
    """UTC ISO 8601 with millisecond precision and ``Z``: a ``since`` the provider takes.
    Rounded *down*, so a since never passes a record it should include."""
    seconds, rest = divmod(max(ns, 0), 1_000_000_000)
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{rest // 1_000_000:03d}Z"


def since_ns(cursor: Cursor | None, overlap_ns: int, floor_ns: int = 0) -> int:
    """Where a run starts listing: the cursor less the overlap (never below ``floor``)."""
    if cursor is None:
        return floor_ns
    return max(cursor.updated_ns - overlap_ns, floor_ns)


def plan_page(stream: Stream, rows: Sequence[Listed], *, cursor: Cursor | None,
              horizon_ns: int, until_ns: int | None = None, origin: str = "reconcile",
              run_id: str = "") -> PagePlan:
    """The changes one listed page produces and the cursor after it."""
    changes: list[InboundChange] = []
    best = cursor
    done = False
    for row in rows:
        if row.updated_ns > horizon_ns or (until_ns is not None and row.updated_ns > until_ns):
            done = True  # sorted by updatedAt: the rest of the list is newer still
            break
        prefix = stream.key if origin == "reconcile" else f"{run_id}:{stream.key}"
        changes.append(InboundChange(
            provider=stream.provider, binding=stream.binding,
            resource_type=stream.resource_type, resource_id=row.record_id, kind="observed",
            attributes=dict(row.attributes), remote_updated_at=row.updated_at,
            origin=origin, origin_id=f"{prefix}:{row.updated_at}:{row.record_id}"))
        here = Cursor(updated_ns=row.updated_ns, updated_at=row.updated_at,
                      record_id=row.record_id)
        if best is None or here.key() > best.key():
            best = here
    return PagePlan(changes=tuple(changes), cursor=best if best != cursor else None,
                    done=done)


def parse_rows(items: Any, *, id_of: Any, attributes_of: Any, updated_of: Any) -> list[Listed]:
    """Listed records from a page's items with the L1 pointers' ``find`` functions."""
    if not isinstance(items, list):
        raise BadPage("the page holds no list of records")
    rows: list[Listed] = []
    for i, item in enumerate(items):
        raw_id = id_of(item)
        record_id = str(raw_id) if isinstance(raw_id, int | str) and not isinstance(
            raw_id, bool) else None
        updated = updated_of(item)
        ns = remote_time_ns(updated) if isinstance(updated, str) else None
        attributes = attributes_of(item)
        if not record_id or ns is None or not isinstance(attributes, dict):
            raise BadPage(f"record {i} of the page has no id, updatedAt or attributes")
        assert isinstance(updated, str)
        rows.append(Listed(record_id=record_id, updated_at=updated, updated_ns=ns,
                           attributes=attributes))
    return rows


def sync_lag_seconds(last_run_at_us: int | None, safety_lag_s: float | None,
                     now_s: float) -> float | None:
    """A stream's sync lag: seconds since it was last known complete, i.e. its last run's
    time less the binding's safety lag (None before a first run or without a policy).
    The console, ``reconcile status`` and the ``integrationd_sync_lag_seconds`` gauge all
    mean this, so they agree."""
    if last_run_at_us is None or safety_lag_s is None:
        return None
    return round(max(now_s - (last_run_at_us / 1e6 - safety_lag_s), 0.0), 1)


def lag_seconds(cursor: Cursor | None, now_ns: int) -> float | None:
    """How far the stream's cursor trails now (None before the first record): the age of
    the newest record seen, not the sync lag (:func:`sync_lag_seconds`)."""
    if cursor is None:
        return None
    return max(now_ns - cursor.updated_ns, 0) / 1e9
