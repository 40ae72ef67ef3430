"""The effect path's quota helpers, synchronously: the after-checkpoint re-check and the
summary the gauges read back."""

from __future__ import annotations

import pytest

from daemon.core.quota import QuotaPolicy
from daemon.services.effect_quota import (
    QuotaKey,
    Reserved,
    still_usable,
    waiting_key,
    waiting_summary,
)

POLICY = QuotaPolicy(limit=10, window_us=1_000_000, jitter_us=250_000)


def _reserved(*slots: int) -> list[Reserved]:
    return [Reserved(QuotaKey(f"p:d:o:{i}", POLICY), slot, f"R{i}", slot)
            for i, slot in enumerate(slots)]


@pytest.mark.parametrize(("slots", "now", "usable"), [
    ((1_000_000,), 1_000_000, True),
    ((1_000_000,), 1_249_999, True),
    ((1_000_000,), 1_250_000, False),   # the checkpoint outlasted the jitter: not sent
    ((1_000_000, 1_200_000), 1_240_000, True),
    ((1_000_000, 1_300_000), 1_300_000, False),  # the earlier one expired meanwhile
    ((1_000_000,), 999_999, False),     # never early
])
def test_a_slot_is_rechecked_after_the_checkpoint(slots: tuple[int, ...], now: int,
                                                  usable: bool) -> None:
    assert still_usable(_reserved(*slots), now) is usable


@pytest.mark.parametrize(("summary", "key"), [
    (waiting_summary("hubspot:per_app_10s:org-1:inst-1", 0.25),
     "hubspot:per_app_10s:org-1:inst-1"),
    (waiting_summary("p:d:key:shared-7", 12.0), "p:d:key:shared-7"),
    ("retry after connect", None),
    ("", None),
])
def test_the_gauges_read_the_waiting_key_back(summary: str, key: str | None) -> None:
    assert waiting_key(summary) == key
