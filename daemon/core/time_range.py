"""A time range as operators type it (``--since 1h``, ``--until 2026-12-06T02:00:00Z``):
pure, the caller gives the clock's now.

A bound is either a UTC moment (RFC 3339 / ISO 8601 with ``Z`` or an offset, or a bare
date, taken as midnight UTC) or an age before now: a number and one unit of ``s``,
``m``/``min``, ``h``, ``d``. Anything else is refused with a sentence saying what is
accepted. Times are epoch microseconds.
"""

from __future__ import annotations

import datetime as dt
import re

import attrs

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|min|h|d)")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
ACCEPTED = ("a UTC time such as 2026-12-06T02:00:00Z (or a date, 2026-12-06) or an age"
            " such as 90s, 15m, 6h, 7d")


class BadTime(ValueError):
    """A bound that is neither a UTC time nor an age."""


@attrs.frozen
class TimeRange:
    since_us: int | None  # None: from the beginning
    until_us: int         # exclusive


def parse_bound(text: str, now_us: int) -> int:
    """One bound in epoch microseconds (raises :class:`BadTime`)."""
    text = text.strip()
    age = _AGE.fullmatch(text)
    if age:
        return now_us - int(float(age.group(1)) * _UNIT_S[age.group(2)] * 1_000_000)
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadTime(f"{text!r} is not a time: give {ACCEPTED}") from None
    if moment.tzinfo is None:
        if len(text) != 10:  # only a bare date is taken as UTC without saying so
            raise BadTime(f"{text!r} has no time zone: end it with Z (UTC) or an offset")
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def parse_range(since: str | None, until: str | None, now_us: int) -> TimeRange:
    """The range ``[since, until)``; ``until`` defaults to now (raises :class:`BadTime`)."""
    start = None if since is None else parse_bound(since, now_us)
    end = now_us if until is None else parse_bound(until, now_us)
    if start is not None and start >= end:
        raise BadTime("--since must be before --until")
    return TimeRange(start, end)
