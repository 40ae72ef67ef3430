"""Latency histograms: bucket bounds, merge, percentiles (table-driven, with bad input)."""

from __future__ import annotations

import pytest

from daemon.core.latency import LatencyHistogram, bucket_of, upper_ms


@pytest.mark.parametrize(
    ("duration_us", "bucket"),
    [(-5, 0), (0, 0), (999, 0), (1000, 1), (1090, 1), (1091, 2), (2000, 9), (1_000_000, 80)],
)
def test_bucket_of(duration_us: int, bucket: int) -> None:
    assert bucket_of(duration_us) == bucket


@pytest.mark.parametrize("duration_us", [1000, 1500, 7_777, 250_000, 3_600_000_000])
def test_a_bucket_bound_is_at_most_nine_percent_above_the_duration(duration_us: int) -> None:
    bound = upper_ms(bucket_of(duration_us))
    assert duration_us / 1000 <= bound <= duration_us / 1000 * 1.0906


def test_upper_ms_refuses_a_negative_bucket() -> None:
    with pytest.raises(ValueError, match="no bucket -1"):
        upper_ms(-1)


@pytest.mark.parametrize(
    ("durations_ms", "q", "expected"),
    [
        ([], 0.5, None),
        ([10], 0.5, 10.9),
        ([10], 0.99, 10.9),
        (list(range(1, 101)), 0.5, 51.9),
        (list(range(1, 101)), 0.99, 100.0 * 1.0),
        ([5] * 99 + [2000], 0.99, 5.5),
        ([5] * 98 + [2000] * 2, 0.99, 2048.0),
    ],
)
def test_percentile(durations_ms: list[int], q: float, expected: float | None) -> None:
    hist = LatencyHistogram.of(d * 1000 for d in durations_ms)
    got = hist.percentile_ms(q)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        # The answer is a bucket bound: never below the true quantile, at most 9 % above.
        assert expected / 1.0906 <= got <= expected * 1.0906


@pytest.mark.parametrize("q", [0.0, -0.5, 1.5])
def test_percentile_refuses_a_quantile_outside_zero_one(q: float) -> None:
    with pytest.raises(ValueError, match="quantile must be in"):
        LatencyHistogram.of([1000]).percentile_ms(q)


def test_merge_adds_counts_and_keeps_buckets_sorted() -> None:
    a = LatencyHistogram.of([1000, 1000, 50_000])
    b = LatencyHistogram.of([1000, 900_000])
    merged = LatencyHistogram.merged([a, b, LatencyHistogram()])
    assert merged.total == 5
    assert [bucket for bucket, _ in merged.counts] == sorted(bucket for bucket, _ in merged.counts)
    assert dict(merged.counts)[bucket_of(1000)] == 3
    assert merged == LatencyHistogram.of([1000, 1000, 50_000, 1000, 900_000])
