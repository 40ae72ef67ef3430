"""What "find anything" needs without I/O: time bounds, id bounds, what a search text is.

Every list of the console's "find" pages is ordered by its row's ULID (attempt, command,
audit and receipt ids are ULIDs minted from the clock reading that wrote the row), so
a time filter is a range of the primary key: ``since`` and ``until`` become id bounds,
and a page is "ids below (or above) the last one shown" (keyset paging, no OFFSET).

A moment is an ISO 8601 time (``2026-12-06T02:00:00Z``; no zone means UTC; a bare date
is its midnight) or a span back from now (``90s``, ``15m``, ``6h``, ``7d``).
"""

from __future__ import annotations

import datetime as dt
import re

from daemon.core.ids import encode_ulid

_AGO = re.compile(r"^([0-9]{1,6})(s|m|h|d)$")
_UNIT_US = {"s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000, "d": 86_400_000_000}
_ZERO = bytes(10)
# The last millisecond a ULID can hold.
MAX_MILLIS = (1 << 48) - 1


class BadMoment(ValueError):
    """A time filter that cannot be read; the message says what is accepted."""


def parse_moment(text: str, now_us: int) -> int:
    """Epoch microseconds of ``text`` (an ISO 8601 time or a span back from ``now_us``)."""
    raw = text.strip()
    match = _AGO.match(raw)
    if match:
        return max(0, now_us - int(match.group(1)) * _UNIT_US[match.group(2)])
    if len(raw) > 40 or not raw:
        raise BadMoment(_HINT)
    try:
        moment = dt.datetime.fromisoformat(raw.replace("z", "Z"))
    except ValueError:
        raise BadMoment(_HINT) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    us = int(moment.timestamp()) * 1_000_000 + moment.microsecond
    if not 0 <= us // 1000 <= MAX_MILLIS:
        raise BadMoment("the time is out of range")
    return us


_HINT = ("a time is ISO 8601 (2026-12-06T02:00:00Z; no zone means UTC) or a span back"
         " from now (90s, 15m, 6h, 7d)")


def id_floor(us: int) -> str:
    """The smallest ULID minted at or after ``us`` (to its millisecond)."""
    return encode_ulid(min(max(0, us // 1000), MAX_MILLIS), _ZERO)

