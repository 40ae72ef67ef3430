"""Retry policy: exponential backoff with full jitter (pure).

``delay = uniform(0, min(cap, base * 2 ** (attempt - 1)))`` with a floor, as in
"Exponential Backoff And Jitter" (AWS architecture blog): full jitter spreads
the retries of a burst of failures so they do not come back in lockstep. The
random sample is an argument so that callers (and tests) own the randomness.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class BackoffPolicy:
    base_s: float = 1.0
    cap_s: float = 300.0
    floor_s: float = 0.05

    def __attrs_post_init__(self) -> None:
        if not 0 < self.floor_s <= self.base_s <= self.cap_s:
            raise ValueError("backoff needs 0 < floor <= base <= cap")

    def delay_s(self, attempt: int, sample: float) -> float:
        """Delay before the next try after ``attempt`` failed tries; ``sample`` in [0, 1)."""
        if attempt < 1:
            raise ValueError("attempt counts from 1")
        if not 0.0 <= sample < 1.0:
            raise ValueError("sample must be in [0, 1)")
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(attempt - 1, 62))
        return max(self.floor_s, ceiling * sample)
