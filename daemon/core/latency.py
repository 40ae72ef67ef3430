"""Latency histograms with log-spaced buckets: small, mergeable, percentiles within 9 %.

Theory of operation
-------------------
A duration (microseconds) falls in bucket 0 when it is under 1 ms, else in
bucket ``1 + floor(8 * log2(ms))``: eight buckets per doubling, so a bucket's
upper bound is at most 2**(1/8) (about 9 %) above any duration in it. A
histogram is the sorted (bucket, count) pairs that are not zero, so one
sample of a few thousand durations keeps a few dozen pairs, and the histograms
of many samples merge by adding counts. A percentile is the upper bound of the
bucket holding that rank: never below the true value, at most 9 % above it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable

import attrs

PER_DOUBLING = 8


def bucket_of(duration_us: int) -> int:
    """The bucket of one duration; a negative duration (clock skew) counts as 0."""
    ms = duration_us / 1000
    if ms < 1:
        return 0
    return 1 + math.floor(PER_DOUBLING * math.log2(ms))


def upper_ms(bucket: int) -> float:
    """The largest duration (ms) bucket ``bucket`` can hold."""
    if bucket < 0:
        raise ValueError(f"no bucket {bucket}")
    return 1.0 if bucket == 0 else 2 ** (bucket / PER_DOUBLING)


@attrs.frozen
class LatencyHistogram:
    """Counts per bucket (sorted, no zeros)."""

    counts: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, durations_us: Iterable[int]) -> LatencyHistogram:
        found = Counter(bucket_of(d) for d in durations_us)
        return cls(tuple(sorted(found.items())))

    @classmethod
    def merged(cls, histograms: Iterable[LatencyHistogram]) -> LatencyHistogram:
        total: Counter[int] = Counter()
        for h in histograms:
            for bucket, n in h.counts:
                total[bucket] += n
        return cls(tuple(sorted((b, n) for b, n in total.items() if n)))

    @property
    def total(self) -> int:
        return sum(n for _, n in self.counts)

    def percentile_ms(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1) as a bucket's upper bound in ms; None when empty."""
        if not 0 < q <= 1:
            raise ValueError(f"quantile must be in (0, 1], not {q}")
        total = self.total
        if total == 0:
            return None
        rank = math.ceil(q * total)
        seen = 0
        for bucket, n in self.counts:
            seen += n
            if seen >= rank:
                return round(upper_ms(bucket), 1)
        raise AssertionError("unreachable: ranks are within the total")  # pragma: no cover
