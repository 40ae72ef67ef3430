"""Server-side SVG line charts with a time axis (no script, no external library).

Theory of operation
-------------------
:func:`line_chart` turns a few named series of ``(at_us, value)`` points into
the parts of one ``<svg>``: a y axis with "nice" ticks (1-2-5 steps from zero), a
time axis in UTC with ticks on whole multiples of a step chosen so that about
five labels fit, light grid lines, and one ``<polyline>`` per series (split
where a value is missing, e.g. no latency measured in that interval). This module
computes the geometry (pure: no I/O, no templates); the ``chart`` macro in
``templates/macros.html`` renders it, so Jinja escapes every text. Colours are
SVG presentation attributes, which the console's Content-Security-Policy
allows (it forbids inline ``style``). The pages and the live poll
(``/admin/overview/live``) render the same SVG.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Any

import attrs

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 24, 30
TIME_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800)
MAX_TIME_TICKS = 6

COLORS = {
    # work states and outcomes
    "pending": "#2f5bd3", "processing": "#0e8a8a", "retry": "#c98200", "dead": "#c0362c",
    "succeeded": "#1f8a4c", "skipped": "#7a7a7a", "cancelled": "#7b3fc4",
    "awaiting_legacy_outcome": "#5b5b8a", "legacy_outcome_unknown": "#a0306e",
    # effect outcome classes
    "ACCEPTED": "#1f8a4c", "REJECTED": "#c0362c", "RETRYABLE_PRE_DISPATCH": "#c98200",
    "REPLAY_SAFE_RETRY": "#8a6d00", "OUTCOME_UNKNOWN": "#7b3fc4",
    # flow and latency
    "commands accepted": "#2f5bd3", "receipts confirmed": "#0e8a8a",
    "response p50": "#2f5bd3", "response p99": "#2f5bd3",
    "receipt p50": "#1f8a4c", "receipt p99": "#1f8a4c",
    # the quota history's allowance line
    "limit": "#7a7a7a",
}
FALLBACK = ("#444444", "#8a4b08", "#00607a", "#6b2fa0")


def color(name: str) -> str:
    found = COLORS.get(name)
    if found is not None:
        return found
    return FALLBACK[sum(name.encode()) % len(FALLBACK)]


@attrs.frozen
class Series:
    """One line: its name (legend and ``data-series``), points, and a dashed flag."""

    name: str
    points: tuple[tuple[int, float | None], ...]
    dashed: bool = False


def nice_max(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 x 10^k at or above ``value`` (1 for nothing)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-9):
            return float(step * power)
    raise AssertionError("unreachable")  # pragma: no cover


def fmt_value(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".")


def time_step_s(span_s: float) -> int:
    """The smallest step in :data:`TIME_STEPS_S` giving at most MAX_TIME_TICKS ticks."""
    for step in TIME_STEPS_S:
        if span_s / step <= MAX_TIME_TICKS:
            return step
    return TIME_STEPS_S[-1] * math.ceil(span_s / (TIME_STEPS_S[-1] * MAX_TIME_TICKS))


def time_ticks(t0_us: int, t1_us: int) -> list[tuple[int, str]]:
    """(at_us, "HH:MM[:SS]" UTC) on whole multiples of the step inside [t0, t1]."""
    span_s = max(1.0, (t1_us - t0_us) / 1e6)
    step = time_step_s(span_s)
    first = math.ceil(t0_us / 1e6 / step) * step
    ticks = []
    at = first
    while at * 1_000_000 <= t1_us:
        moment = dt.datetime.fromtimestamp(at, tz=dt.UTC)
        ticks.append((at * 1_000_000, moment.strftime("%H:%M:%S" if step < 60 else "%H:%M")))
        at += step
    return ticks


def _segments(points: Sequence[tuple[int, float | None]]) -> list[list[tuple[int, float]]]:
    out: list[list[tuple[int, float]]] = [[]]
    for at, value in points:
        if value is None:
            if out[-1]:
                out.append([])
        else:
            out[-1].append((at, value))
    return [s for s in out if s]


def line_chart(chart_id: str, label: str, lines: Sequence[Series], unit: str,
               now_us: int | None = None) -> dict[str, Any]:
    """The geometry of one chart, for the ``chart`` macro (``templates/macros.html``),
    which escapes every text; ``now_us`` ends the time axis (default: the last point)."""
    xs = [at for s in lines for at, _ in s.points]
    values = [v for s in lines for _, v in s.points if v is not None]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    base_y = TOP + plot_h
    doc: dict[str, Any] = {
        "id": chart_id, "label": label, "unit": unit, "width": WIDTH, "height": HEIGHT,
        "left": LEFT, "right": WIDTH - RIGHT, "top": TOP, "base": base_y, "empty": not xs,
        "y_ticks": [], "x_ticks": [], "lines": [], "dots": [],
    }
    if not xs:
        return doc
    t1 = max(max(xs), now_us or 0)
    t0 = min(xs)
    if t1 - t0 < 1_000_000:
        t0 = t1 - 1_000_000
    top = nice_max(max(values, default=0.0))
    x_scale = plot_w / (t1 - t0)
    y_scale = plot_h / top

    def sx(at: int) -> float:
        return round(LEFT + (at - t0) * x_scale, 1)

    def sy(value: float) -> float:
        return round(base_y - value * y_scale, 1)

    doc["y_ticks"] = [{"y": sy(top * i / 4), "text": fmt_value(top * i / 4)} for i in range(5)]
    doc["x_ticks"] = [{"x": sx(at), "text": text} for at, text in time_ticks(t0, t1)]
    for line in lines:
        stroke = color(line.name)
        for segment in _segments(line.points):
            coords = [(sx(at), sy(v)) for at, v in segment]
            if len(coords) == 1:
                doc["dots"].append({"x": coords[0][0], "y": coords[0][1], "color": stroke,
                                    "name": line.name})
                continue
            doc["lines"].append({"points": " ".join([f"{x},{y}" for x, y in coords]),
                                 "color": stroke, "name": line.name, "dashed": line.dashed})
    return doc


def _legend(name: str, figure: str, dashed: bool = False) -> dict[str, Any]:
    return {"name": name, "figure": figure, "color": color(name), "dashed": dashed}


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{fmt_value(value)} ms"


# The last charts drawn: (key, charts). The read model hands out the same ``families`` and
# ``flow`` objects until the next sample (admin_ui.readmodels), so their identity and the
# sample time say whether the geometry would come out the same. The entry keeps those
# objects alive, so their ids cannot be reused while it stands.
_drawn: list[tuple[tuple[int, int, int | None, float], tuple[Any, Any], dict[str, Any]]] = []


def overview_charts(doc: dict[str, Any]) -> dict[str, Any]:
    """Every overview chart (geometry and legend) from the overview read model: per family
    depth by state and finished/s by outcome, then the effect flow and its latency."""
    key = (id(doc["families"]), id(doc["flow"]), doc["sample"]["at_us"],
           doc["throughput"]["window_s"])
    if _drawn and _drawn[0][0] == key:
        return _drawn[0][2]
    charts = _draw(doc)
    _drawn[:] = [(key, (doc["families"], doc["flow"]), charts)]
    return charts


def _draw(doc: dict[str, Any]) -> dict[str, Any]:
    # The time axis ends at the newest sample (the page says how old that is), so the
    # charts depend on the history alone and are computed once per sample.
    now = doc["sample"]["at_us"]
    window = doc["throughput"]["window_s"]
    families = []
    for fam in doc["families"]:
        name = fam["family"]
        depth = [Series(s, tuple((p["at_us"], p["depth"][s]) for p in fam["series"]))
                 for s in fam["states"]]
        done = [Series(o, tuple((p["at_us"], p["per_s"][o]) for p in fam["series"]))
                for o in fam["outcomes"]]
        families.append({
            "family": name,
            "depth": line_chart(f"chart-depth-{name}", f"{name}: queue depth by state", depth,
                                "items", now),
            "depth_legend": [_legend(s, fmt_value(fam["depth_now"][s]))
                             for s in fam["states"]],
            "finished": line_chart(f"chart-finished-{name}",
                                   f"{name}: executions finished per second by outcome", done,
                                   "per s", now),
            "finished_legend": [_legend(o, f"{fmt_value(fam['per_s_window'][o])}/s")
                                for o in fam["outcomes"]],
        })
    flow = doc["flow"]
    points = flow["series"]
    rates = [Series("commands accepted", tuple((p["at_us"], p["accepted_per_s"]) for p in points))]
    rates += [Series(o, tuple((p["at_us"], p["effects_per_s"][o]) for p in points))
              for o in flow["outcomes"]]
    rates.append(Series("receipts confirmed",
                        tuple((p["at_us"], p["receipts_per_s"]) for p in points)))
    rate_legend = [_legend("commands accepted", f"{fmt_value(flow['accepted_per_s'])}/s")]
    rate_legend += [_legend(o, f"{fmt_value(flow['effects_per_s'][o])}/s")
                    for o in flow["outcomes"]]
    rate_legend.append(_legend("receipts confirmed", f"{fmt_value(flow['receipts_per_s'])}/s"))
    keys = (("response p50", "response_p50_ms", False), ("response p99", "response_p99_ms", True),
            ("receipt p50", "receipt_p50_ms", False), ("receipt p99", "receipt_p99_ms", True))
    latency = [Series(name, tuple((p["at_us"], p[key]) for p in points), dashed)
               for name, key, dashed in keys]
    lat = flow["latency"]
    return {
        "window_s": window,
        "families": families,
        "flow": line_chart("chart-flow", "effect path: events per second", rates, "per s", now),
        "flow_legend": rate_legend,
        "latency": line_chart("chart-latency", "end-to-end latency, p50 and p99", latency, "ms",
                              now),
        "latency_legend": [_legend(name, _ms(lat[key]), dashed) for name, key, dashed in keys],
        "latency_samples": lat["samples"],
    }
