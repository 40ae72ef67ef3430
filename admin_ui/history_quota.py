"""The History page's quota chart: per key, slots used (granted minus given back) per
step against the key's allowance for the step, from the ``history_quota`` rollup
(storage/history_quota.py).

Pure: it turns the rollup's points and the keys' limits into the JSON read model the
page, the API and ``integrationd history show`` share. The allowance of a step is the
limit in force then (recorded with the step's grants, ``limit_then``), else the key's
latest policy (``limit_count`` slots per ``window_us``), scaled to the step; a point
links to the slots behind it (``/admin/history/slots``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from admin_ui.charts import color
from admin_ui.render import fmt_iso
from daemon.core.history_range import HistoryRange
from storage.history_quota import GRANTED, RELEASED, QuotaLimit, QuotaPoint

# The busiest keys of the range (by slots used) the document carries.
MAX_KEYS = 20
# The keys the chart draws (the rest are in the JSON and the table).
CHART_KEYS = 6


def slots_href(quota_key: str, at_us: int, step_us: int) -> str:
    return "/admin/history/slots?" + urlencode({
        "key": quota_key, "from": str(at_us // 1_000_000),
        "to": str((at_us + step_us) // 1_000_000)})


def quota_doc(points: list[QuotaPoint], limits: list[QuotaLimit], chosen: HistoryRange,
              steps: list[int]) -> dict[str, Any]:
    """Per key: per step the slots granted, given back and used, the allowance and the
    use as a percentage of it; the busiest :data:`MAX_KEYS` keys first."""
    per_key: dict[str, dict[int, dict[str, int]]] = {}
    for p in points:
        per_key.setdefault(p.quota_key, {}).setdefault(p.at_us, {})[p.metric] = p.n
    limit_of = {lim.quota_key: lim for lim in limits}
    rate_of = {(p.quota_key, p.at_us): p.per_us for p in points
               if p.metric == GRANTED and p.per_us is not None}
    keys: list[dict[str, Any]] = []
    for quota_key, per_step in per_key.items():
        lim = limit_of.get(quota_key)
        allowed = (None if lim is None or lim.window_us <= 0
                   else round(lim.limit_count * chosen.step_us / lim.window_us, 2))
        rows: list[dict[str, Any]] = []
        for at in steps:
            got = per_step.get(at, {})
            granted, released = got.get(GRANTED, 0), got.get(RELEASED, 0)
            used = granted - released
            # The limit in force in the step where a grant recorded it, else the latest.
            rate = rate_of.get((quota_key, at))
            then = allowed if rate is None else round(rate * chosen.step_us, 2)
            rows.append({"at_us": at, "at": fmt_iso(at), "granted": granted,
                         "released": released, "used": used, "allowed": then,
                         "limit_then": rate is not None,
                         "use_pct": (None if not then
                                     else round(100 * used / then, 1)),
                         "items": slots_href(quota_key, at, chosen.step_us)})
        used_total = sum(r["used"] for r in rows)
        pcts = [r["use_pct"] for r in rows if r["use_pct"] is not None]
        keys.append({
            "quota_key": quota_key, "color": color(quota_key),
            "limit_count": None if lim is None else lim.limit_count,
            "window_us": None if lim is None else lim.window_us,
            "allowed_per_step": allowed,
            "granted_total": sum(r["granted"] for r in rows),
            "released_total": sum(r["released"] for r in rows),
            "used_total": used_total, "peak_use_pct": max(pcts, default=None),
            "points": rows,
        })
    keys.sort(key=lambda k: (-k["used_total"], k["quota_key"]))
    return {"keys": keys[:MAX_KEYS], "more_keys": max(0, len(keys) - MAX_KEYS)}


def quota_lines(doc: dict[str, Any]) -> list[tuple[str, bool, list[tuple[int, float | None,
                                                                          str, str]]]]:
    """The chart: the busiest keys' use in % of their allowance, and 100 % dashed."""
    lines: list[tuple[str, bool, list[tuple[int, float | None, str, str]]]] = [
        (k["quota_key"], False, [(p["at_us"], p["use_pct"], p["items"], p["at"])
                                 for p in k["points"]])
        for k in doc["quota"]["keys"][:CHART_KEYS] if k["allowed_per_step"]]
    if lines:
        lines.append(("limit", True, [(at, 100.0, "", text)
                                      for at, _, _, text in lines[0][2]]))
    return lines
