"""The claim spread: wider after a lost race, back towards the oldest window when
claims come back clean or short (daemon/core/claim_spread.py)."""

from __future__ import annotations

import pytest

from daemon.core.claim_spread import FIRST_SPREAD, MAX_SPREAD, NO_SPREAD, next_spread


@pytest.mark.parametrize(
    ("spread", "claimed", "contended", "expected"),
    [
        # A lost race: at least the first spread, then doubling, never past the cap.
        (NO_SPREAD, 0, 1, FIRST_SPREAD),
        (NO_SPREAD, 96, 32, FIRST_SPREAD),
        (FIRST_SPREAD, 127, 1, 2 * FIRST_SPREAD),
        (MAX_SPREAD // 2, 0, 128, MAX_SPREAD),
        (MAX_SPREAD, 0, 128, MAX_SPREAD),
        # A full claim without a lost race: one slot narrower, not below the first spread.
        (2 * FIRST_SPREAD, 128, 0, 2 * FIRST_SPREAD - 1),
        (FIRST_SPREAD, 128, 0, FIRST_SPREAD),
        (NO_SPREAD, 128, 0, NO_SPREAD),
        # A short claim (shallow ready set, or idle): halved, down to the oldest window.
        (MAX_SPREAD, 127, 0, MAX_SPREAD // 2),
        (FIRST_SPREAD, 0, 0, FIRST_SPREAD // 2),
        (2, 0, 0, NO_SPREAD),
        (NO_SPREAD, 0, 0, NO_SPREAD),
    ],
)
def test_next_spread(spread: int, claimed: int, contended: int, expected: int) -> None:
    assert next_spread(spread, limit=128, claimed=claimed, contended=contended) == expected
