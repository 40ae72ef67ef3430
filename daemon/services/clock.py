"""Clocks. One reading per decision, passed down as ``now_us``."""

from __future__ import annotations

import time
from typing import Protocol

import trio


class Clock(Protocol):
    def now_us(self) -> int:
        """UTC epoch microseconds."""
        ...


class WallClock:
    """The host's UTC clock. Leases tolerate skew up to ``work.lease_margin``."""

    def now_us(self) -> int:
        return time.time_ns() // 1000


def wall_seconds() -> float:
    """The host's UTC clock in epoch seconds, for the few places (session cookies, metric
    ages computed at scrape time) that are given no :class:`Clock`."""
    return time.time()


class TrioClock:
    """Epoch time that follows trio's clock (so MockClock drives leases in tests)."""

    def __init__(self, epoch_us: int = 1_800_000_000_000_000) -> None:
        self._offset_us = epoch_us

    def now_us(self) -> int:
        return self._offset_us + int(trio.current_time() * 1_000_000)
