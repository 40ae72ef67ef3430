"""When a replica tries to sample the queue's pressure (daemon/core/pressure_sample.py):
once per minute, not before its offset into the minute."""

from __future__ import annotations

import pytest

from daemon.core.pressure_sample import MINUTE_US, SPREAD_US, minute_to_sample, offset_us

M = 1_800_000_000_000_000 - 1_800_000_000_000_000 % MINUTE_US
S = 1_000_000


@pytest.mark.parametrize(("now", "last", "offset", "want"), [
    (M + 10 * S, None, 5 * S, M),               # past the offset, never sampled
    (M + 5 * S, None, 5 * S, M),                # at the offset
    (M + 4 * S, None, 5 * S, None),             # before the offset
    (M + 59 * S, M, 0, None),                   # this minute settled already
    (M + MINUTE_US, M, 0, M + MINUTE_US),       # the next minute, offset 0
    (M + MINUTE_US + S, M, 30 * S, None),       # the next minute, before its offset
    (M + 5 * MINUTE_US + 31 * S, M, 30 * S, M + 5 * MINUTE_US),  # minutes skipped: now's
    (M + 10 * S, M + MINUTE_US, 0, None),       # a clock that stepped back
])
def test_which_minute_to_try(now: int, last: int | None, offset: int,
                             want: int | None) -> None:
    assert minute_to_sample(now, last, offset) == want


def test_offsets_are_whole_seconds_within_the_spread_and_differ_per_replica() -> None:
    offsets = {offset_us(f"replica-{i}") for i in range(50)}
    assert all(0 <= o < SPREAD_US and o % S == 0 for o in offsets)
    assert len(offsets) > 10
    assert offset_us("replica-1") == offset_us("replica-1")
