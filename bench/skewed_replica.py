"""Run ``integrationd`` with its wall clock skewed by a fixed offset (the torture run's
clock skew between replicas).

    python -m bench.skewed_replica OFFSET_MS --config replica.toml run

Every lease, backoff and read-back decision of a replica takes its time from
``daemon.services.clock.WallClock`` (one reading per decision, passed down as ``now_us``);
this wrapper shifts that one clock source by ``OFFSET_MS`` milliseconds, as a host whose NTP
is off by that much would be, then runs the ordinary CLI. It lives in ``bench/`` on purpose:
the offset is a benchmark's knob, not a setting, so no production configuration can reach it.
Clocks must stay within ``work.lease_margin`` of each other (docs/tidb.md, "The lease clock")
and within the provider operation's ``max_clock_skew`` of the provider's clock.
"""

from __future__ import annotations

import sys
import time

from daemon.cli import main
from daemon.services.clock import WallClock


def skew(offset_us: int) -> None:
    """Shift every ``WallClock`` of this process by ``offset_us`` microseconds."""

    def now_us(self: WallClock) -> int:
        return time.time_ns() // 1000 + offset_us

    WallClock.now_us = now_us  # type: ignore[method-assign]


def run() -> None:
    offset_ms, args = float(sys.argv[1]), sys.argv[2:]
    skew(int(offset_ms * 1000))
    sys.argv = ["integrationd", *args]
    sys.exit(main())


if __name__ == "__main__":
    run()
