"""The console's history ranges (pure): presets end now, custom ranges name both ends,
and whatever cannot be drawn is refused with a message for the operator."""

from __future__ import annotations

import pytest

from daemon.core.history_range import (
    MAX_POINTS,
    MINUTE_US,
    BadRange,
    HistoryRange,
    resolve,
    step_for,
)

NOW = 1_800_000_030_000_000  # 30 s into a minute
H = 60 * MINUTE_US
MINUTE_END = NOW - NOW % MINUTE_US + MINUTE_US


@pytest.mark.parametrize(("preset", "span", "step"), [
    (None, H, MINUTE_US),
    ("15m", 15 * MINUTE_US, MINUTE_US),
    ("1h", H, MINUTE_US),
    ("6h", 6 * H, 5 * MINUTE_US),
    ("24h", 24 * H, 60 * MINUTE_US),
    ("7d", 7 * 24 * H, 120 * MINUTE_US),
])
def test_a_preset_ends_with_the_current_minute(preset: str | None, span: int,
                                               step: int) -> None:
    chosen = resolve(NOW, preset, None, None)
    assert chosen == HistoryRange(MINUTE_END - span, MINUTE_END, step, preset or "1h")
    assert chosen.points <= MAX_POINTS


@pytest.mark.parametrize(("start", "end", "since", "until"), [
    ("2027-01-15T08:00Z", "2027-01-15T09:00Z", 1_800_000_000 * 10**6, 1_800_003_600 * 10**6),
    ("1800000000", "1800003600", 1_800_000_000 * 10**6, 1_800_003_600 * 10**6),
    ("2027-01-15T08:00:00+00:00", "2027-01-15T08:30:00", 1_800_000_000 * 10**6,
     1_800_001_800 * 10**6),
    # The start is drawn from its minute's first microsecond.
    ("2027-01-15T08:00:42Z", "2027-01-15T08:30Z", 1_800_000_000 * 10**6,
     1_800_001_800 * 10**6),
])
def test_a_custom_range_is_read_as_utc(start: str, end: str, since: int, until: int) -> None:
    chosen = resolve(NOW, "custom", start, end)
    assert chosen.preset is None and chosen.points <= MAX_POINTS
    assert (chosen.since_us, chosen.until_us) == (since, until)


def test_iso_and_epoch_seconds_name_the_same_moment() -> None:
    iso = resolve(NOW, None, "2027-01-15T08:00Z", "2027-01-15T09:00Z")
    epoch = resolve(NOW, None, "1800000000", "1800003600")
    assert iso == epoch
    # The console's filter form names a typed range range=custom.
    assert resolve(NOW, "custom", "1800000000", "1800003600") == epoch


@pytest.mark.parametrize(("preset", "start", "end", "message"), [
    ("2h", None, None, "unknown range '2h'"),
    ("1h", "1800000000", "1800003600", "either range or from and to"),
    (None, "1800000000", None, "needs both from and to"),
    ("custom", None, None, "needs both from and to"),
    ("custom", None, "1800000000", "needs both from and to"),
    (None, None, "1800000000", "needs both from and to"),
    (None, "yesterday", "1800000000", "from must be an ISO 8601 UTC time"),
    (None, "1800000000", "2027-13-01", "to must be an ISO 8601 UTC time"),
    (None, "1800003600", "1800000000", "to must be later than from"),
    (None, "1800000000", "1800000000", "to must be later than from"),
    (None, "1800000000", "1800000030", "at least one minute"),
    (None, "1700000000", "1800000000", "at most 92 days"),
    (None, "0001-01-01T00:00Z", "1800000000", "from is out of range"),
    (None, "1970-01-01T00:30+01:00", "1800000000", "from is out of range"),
    (None, "1800000000", "9999-12-31T23:59-23:59", "to is out of range"),
])
def test_what_cannot_be_drawn_is_refused_with_a_message(
        preset: str | None, start: str | None, end: str | None, message: str) -> None:
    with pytest.raises(BadRange, match=message):
        resolve(NOW, preset, start, end)


@pytest.mark.parametrize(("span", "step_min"), [
    (MINUTE_US, 1), (MAX_POINTS * MINUTE_US, 1), (MAX_POINTS * MINUTE_US + 1, 2),
    (90 * 24 * H, 1440),
])
def test_the_step_keeps_a_chart_within_its_points(span: int, step_min: int) -> None:
    assert step_for(span) == step_min * MINUTE_US
