"""Time ranges as operators type them, table-driven (daemon/core/time_range.py)."""

from __future__ import annotations

import pytest

from daemon.core.time_range import BadTime, TimeRange, parse_bound, parse_range

NOW = 1_796_000_000_000_000  # 2026-11-30 01:33:20Z
S = 1_000_000


@pytest.mark.parametrize(("text", "value"), [
    ("90s", NOW - 90 * S),
    ("15m", NOW - 900 * S),
    ("15min", NOW - 900 * S),
    ("1.5h", NOW - 5400 * S),
    ("7d", NOW - 7 * 86400 * S),
    ("2026-12-06T02:00:00Z", 1_796_522_400 * S),
    ("2026-12-06T03:00:00+01:00", 1_796_522_400 * S),
    ("2026-12-06T02:00:00.250000Z", 1_796_522_400 * S + 250_000),
    ("2026-12-06", 1_796_515_200 * S),
])
def test_bounds(text: str, value: int) -> None:
    assert parse_bound(text, NOW) == value


@pytest.mark.parametrize("text", [
    "", "yesterday", "15", "15 weeks", "-5m", "2026-12-06T02:00:00", "2026-13-01",
    "1h ago",
])
def test_bounds_refused(text: str) -> None:
    with pytest.raises(BadTime):
        parse_bound(text, NOW)


def test_ranges() -> None:
    assert parse_range(None, None, NOW) == TimeRange(None, NOW)
    assert parse_range("1h", None, NOW) == TimeRange(NOW - 3600 * S, NOW)
    assert parse_range("2h", "1h", NOW) == TimeRange(NOW - 7200 * S, NOW - 3600 * S)
    with pytest.raises(BadTime, match="--since must be before --until"):
        parse_range("1h", "2h", NOW)
    with pytest.raises(BadTime, match="--since must be before --until"):
        parse_range("1h", "1h", NOW)
