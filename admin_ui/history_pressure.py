"""The History page's queue-pressure chart: per step, the highest per-minute sample of
the work queue's ready, waiting (retry backoff, held) and claimed items, of one family
or all, from ``history_pressure`` (storage/history_pressure.py).

Pure: it turns the samples into the JSON read model the page, the API and ``integrationd
history show`` share. A step no replica sampled is ``null`` (a gap in the chart, not a
zero). A sample counts the queue, it does not list it, so the items behind a past point
are not known: a point links to the executions of its family that finished in its step
(what left the queue then), and each series links to its items as they are now.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from admin_ui.charts import color
from admin_ui.render import fmt_iso
from daemon.core.history_range import HistoryRange
from storage.history_pressure import ALL, CLAIMED, HELD, READY, RETRY_WAIT, PressurePoint

# (series, legend name, the work list's state for "now").
SERIES = ((READY, "ready", "pending"), (RETRY_WAIT, "waiting: retry", "retry"),
          (HELD, "waiting: held", "pending"), (CLAIMED, "claimed", "processing"))


def _items_href(at_us: int, step_us: int, family: str | None) -> str:
    query = {"from": str(at_us // 1_000_000), "to": str((at_us + step_us) // 1_000_000)}
    if family:
        query["family"] = family
    return "/admin/history/items?" + urlencode(query)


def _now_href(state: str, family: str | None) -> str:
    query = {"state": state}
    if family:
        query["family"] = family
    return "/admin/work?" + urlencode(query)


def pressure_doc(points: list[PressurePoint], chosen: HistoryRange, family: str | None,
                 steps: list[int]) -> dict[str, Any]:
    """Per series, per step the highest sample (null: not sampled), whether a count
    stopped at the sampler's cap, and the range's peak."""
    sampled = {p.at_us for p in points if p.family == ALL}
    want = family if family is not None else ALL
    got = {(p.at_us, p.series): p for p in points if p.family == want}
    series = []
    for key, name, state in SERIES:
        rows: list[dict[str, Any]] = []
        for at in steps:
            p = got.get((at, key))
            n = p.n if p is not None else (0 if at in sampled else None)
            rows.append({"at_us": at, "at": fmt_iso(at), "n": n,
                         "more": bool(p is not None and p.more),
                         "items": _items_href(at, chosen.step_us, family)})
        values: list[int] = [r["n"] for r in rows if r["n"] is not None]
        series.append({"series": key, "name": name, "color": color(name),
                       "peak": max(values, default=None),
                       "latest": next((r["n"] for r in reversed(rows) if r["n"] is not None),
                                      None),
                       "more": any(r["more"] for r in rows),
                       "now": _now_href(state, family), "points": rows})
    return {"family": family, "sampled_steps": sum(1 for at in steps if at in sampled),
            "steps": len(steps), "series": series}


def queue_pressure_lines(doc: dict[str, Any]) -> list[tuple[str, bool, list[tuple[int, float | None,
                                                                            str, str]]]]:
    return [(s["name"], False, [(p["at_us"], None if p["n"] is None else float(p["n"]),
                                 p["items"], p["at"]) for p in s["points"]])
            for s in doc["queue_pressure"]["series"]]
