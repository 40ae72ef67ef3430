"""Who may call the token endpoint: refresh, wait, use, in doubt (table-driven)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from daemon.core.refresh_decision import RefreshDecision, RefreshFacts, decide_refresh

NOW = 1_000_000
# An expired lease for the grant's version 3, whose refresh call left: the case that
# must never present the refresh token again.
SENT = RefreshFacts(grant_valid=True, grant_version=3, seen_version=3, held=True,
                    until_us=NOW - 1, from_version=3, marked=True, call_sent=True,
                    spends_credential=True, now_us=NOW)

D = RefreshDecision
ROWS: list[tuple[str, dict[str, Any], RefreshDecision]] = [
    ("expired, sent, refresh: in doubt", {}, D.IN_DOUBT),
    ("expired, marker by a build that writes none: in doubt",
     {"marked": False, "call_sent": False}, D.IN_DOUBT),
    ("expired, never left: refresh again, the token is unspent", {"call_sent": False},
     D.REFRESH),
    ("expired, sent, but a mint: an app JWT spends nothing", {"spends_credential": False},
     D.REFRESH),
    ("expired, unmarked mint", {"spends_credential": False, "marked": False}, D.REFRESH),
    ("expired, sent, for an older version: that token was replaced",
     {"from_version": 2}, D.REFRESH),
    ("live lease, sent: wait for it", {"until_us": NOW + 1}, D.WAIT),
    ("live lease until exactly now: still live", {"until_us": NOW}, D.WAIT),
    ("live lease, never sent: wait", {"until_us": NOW + 1, "call_sent": False}, D.WAIT),
    ("no holder: refresh", {"held": False}, D.REFRESH),
    ("grant moved past what the caller saw: use it", {"grant_version": 4}, D.USE),
    ("grant moved, even with a live lease: use it",
     {"grant_version": 4, "until_us": NOW + 1}, D.USE),
    # Negative rows: nothing is ever refreshed for a grant that is not valid.
    ("grant not valid, no lease", {"grant_valid": False, "held": False}, D.UNUSABLE),
    ("grant not valid, in doubt", {"grant_valid": False}, D.UNUSABLE),
    ("grant not valid, moved", {"grant_valid": False, "grant_version": 4}, D.UNUSABLE),
]


@pytest.mark.parametrize(("why", "change", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_the_refresh_decision(why: str, change: dict[str, Any],
                              expected: RefreshDecision) -> None:
    assert decide_refresh(attrs.evolve(SENT, **change)) is expected, why


def test_no_row_lets_a_possibly_spent_refresh_token_be_presented_again() -> None:
    """Exhaustively: an expired lease of this version whose call may have left never
    yields REFRESH for a credential that rotation spends."""
    for sent in (True, False):
        for marked in (True, False):
            if not (sent or not marked):
                continue
            for until in (NOW - 10, NOW - 1):
                facts = attrs.evolve(SENT, call_sent=sent, marked=marked, until_us=until)
                assert decide_refresh(facts) is D.IN_DOUBT, facts
