"""Time filters of the find lists (daemon/core/find_query.py): table-driven, with the
inputs that must be refused."""

from __future__ import annotations

import pytest

from daemon.core.find_query import BadMoment, id_floor, parse_moment
from daemon.core.ids import is_ulid, ulid_millis

NOW = 1_800_000_000_000_000  # 2027-01-15 08:00:00Z
HOUR = 3_600_000_000


@pytest.mark.parametrize(("text", "expected"), [
    ("90s", NOW - 90_000_000),
    ("15m", NOW - 15 * 60_000_000),
    ("6h", NOW - 6 * HOUR),
    ("7d", NOW - 7 * 24 * HOUR),
    ("2027-01-15T08:00:00Z", NOW),
    ("2027-01-15T08:00:00z", NOW),
    ("2027-01-15T08:00:00", NOW),  # no zone: UTC
    ("2027-01-15T09:00:00+01:00", NOW),
    ("2027-01-15 08:00:00.5Z", NOW + 500_000),
    ("2027-01-15", NOW - 8 * HOUR),
    (" 6h ", NOW - 6 * HOUR),
    ("999999d", 0),  # further back than the epoch: the epoch
])
def test_moments(text: str, expected: int) -> None:
    assert parse_moment(text, NOW) == expected


@pytest.mark.parametrize("text", [
    "", "yesterday", "6", "h", "-6h", "6 h", "6w", "1234567d", "2027-13-01", "2027-01-15T25:00",
    "1800000000000000", "x" * 41, "\x00",
])
def test_unreadable_moments_are_refused_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(BadMoment, match=r"ISO 8601|out of range"):
        parse_moment(text, NOW)


def test_id_floor_is_the_smallest_id_of_its_millisecond() -> None:
    floor = id_floor(NOW + 1_999)
    assert is_ulid(floor)
    assert ulid_millis(floor) == NOW // 1000 + 1
    assert floor.endswith("0" * 16)
    assert id_floor(-5) == "0" * 26
