"""The console's history ranges: presets, a custom span, and the step to draw them at.

Pure: a range is resolved against a ``now`` the caller passes. A preset
(``15m``, ``1h``, ``6h``, ``24h``, ``7d``) ends now; a custom range names both ends
as ISO 8601 UTC times (``2026-12-06T01:00`` or ``...Z``/``+00:00``) or epoch
seconds. Whatever cannot be parsed, or asks for a span the rollup cannot draw
(ends reversed, shorter than a minute, longer than :data:`MAX_SPAN_US`), is a
:class:`BadRange` whose message says what is accepted.

The step is a whole number of minutes (the rollup's bucket) giving at most
:data:`MAX_POINTS` points, rounded up to a step people read (1, 2, 5, 10 minutes,
1, 2, 3, 6, 12 hours, whole days).
"""

from __future__ import annotations

import datetime as dt

import attrs

MINUTE_US = 60_000_000
PRESETS_US: dict[str, int] = {
    "15m": 15 * MINUTE_US,
    "1h": 60 * MINUTE_US,
    "6h": 360 * MINUTE_US,
    "24h": 1440 * MINUTE_US,
    "7d": 7 * 1440 * MINUTE_US,
}
DEFAULT_PRESET = "1h"
MAX_SPAN_US = 92 * 1440 * MINUTE_US  # a quarter: the longest custom range
MAX_POINTS = 120
# Minutes up to 10, then whole hours, then days: a step reads the rollup's coarsest
# level that tiles it (storage/history.py: 5 and 10 minutes the five-minute rows, 6 and
# 12 hours the six-hour rows, a day the day rows), so a long range reads few rows.
STEPS_MIN = (1, 2, 5, 10, 60, 120, 180, 360, 720, 1440)


class BadRange(ValueError):
    """A range that cannot be drawn; the message is for the operator."""


@attrs.frozen
class HistoryRange:
    """``[since_us, until_us)`` drawn at ``step_us``; ``preset`` is None for a custom one."""

    since_us: int
    until_us: int
    step_us: int
    preset: str | None

    @property
    def points(self) -> int:
        return -(-(self.until_us - self.since_us) // self.step_us)


def step_for(span_us: int) -> int:
    for minutes in STEPS_MIN:
        if span_us <= minutes * MINUTE_US * MAX_POINTS:
            return minutes * MINUTE_US
    days = -(-span_us // (1440 * MINUTE_US * MAX_POINTS))
    return days * 1440 * MINUTE_US


def parse_time(text: str, name: str) -> int:
    """Epoch microseconds from ISO 8601 (UTC if no offset is given) or epoch seconds."""
    raw = text.strip()
    if raw.isdigit() and len(raw) <= 11:
        return int(raw) * 1_000_000
    try:
        moment = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadRange(f"{name} must be an ISO 8601 UTC time such as 2026-12-06T01:00Z"
                       f" or epoch seconds, not {raw[:40]!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    try:  # an offset can carry the year 9999 past the calendar's end
        utc = moment.astimezone(dt.UTC)
    except OverflowError:
        raise BadRange(f"{name} is out of range") from None
    if utc.year < 1970:
        raise BadRange(f"{name} is out of range")
    return int(utc.timestamp()) * 1_000_000 + utc.microsecond


def resolve(now_us: int, preset: str | None, start: str | None,
            end: str | None) -> HistoryRange:
    """The range a request names (a preset, or ``start`` and ``end``), ending by ``now``."""
    if start is None and end is None and preset != "custom":
        name = preset or DEFAULT_PRESET
        span = PRESETS_US.get(name)
        if span is None:
            known = ", ".join(PRESETS_US)
            raise BadRange(f"unknown range {name!r} (known: {known}, or from and to)")
        step = step_for(span)
        until = now_us - now_us % MINUTE_US + MINUTE_US
        return HistoryRange(until - span, until, step, name)
    if preset is not None and preset != "custom":
        raise BadRange("give either range or from and to, not both"
                       " (range=custom goes with from and to)")
    if start is None or end is None:
        raise BadRange("a custom range needs both from and to")
    since, until = parse_time(start, "from"), parse_time(end, "to")
    if until <= since:
        raise BadRange("to must be later than from")
    if until - since < MINUTE_US:
        raise BadRange("a custom range is at least one minute long")
    if until - since > MAX_SPAN_US:
        raise BadRange("a custom range is at most 92 days long")
    step = step_for(until - since)
    since -= since % MINUTE_US
    return HistoryRange(since, until, step, None)
