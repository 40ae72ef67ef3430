"""Times and spans as people read them (the console, the CLI): pure, no clock read.

A moment is UTC wall time to the second (``2026-12-04 18:00:00Z``); a span is one
rounded unit (``42 s``, ``7 min``, ``3.5 h``, ``2.1 d``). The exact value stays in the
JSON output and on hover in the console.
"""

from __future__ import annotations

import datetime as dt

DASH = "\u2014"


def span_text(seconds: float) -> str:
    """A short duration: ``42 s``, ``7 min``, ``3.5 h``, ``2.1 d``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def wall_text(us: int) -> str:
    """An epoch-microsecond moment as UTC wall time."""
    return dt.datetime.fromtimestamp(us / 1_000_000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def latency_text(ms: float) -> str:
    """A latency: ``850 ms``, ``2.4 s``, then as :func:`span_text` (``7 min``)."""
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 90_000:
        return f"{ms / 1000:.1f} s"
    return span_text(ms / 1000)
