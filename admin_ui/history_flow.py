"""The History page's effect-path charts: pressure (commands accepted against receipts
confirmed) and latency (accept -> provider answer -> Runtime receipt), from the
``history_flow`` rollup (storage/history_flow.py), per org, binding and operation.

Pure: these functions turn the rollup's points into the JSON read model the page, the
API and ``integrationd history show`` share. Every point names the link to the commands
behind it (``/admin/history/commands``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from admin_ui.charts import color
from admin_ui.render import fmt_iso
from daemon.core.history_range import HistoryRange
from daemon.core.latency import LatencyHistogram
from storage.history_flow import ACCEPTED, RECEIPTED, FlowFilter, FlowPoint

PRESSURE_SERIES = (("commands accepted", ACCEPTED), ("receipts confirmed", RECEIPTED))
# The latency lines (legend names shared with the overview's live charts).
LATENCY_SERIES = (("response p50", "response", 0.5), ("response p99", "response", 0.99),
                  ("receipt p50", "receipt", 0.5), ("receipt p99", "receipt", 0.99))
QUANTILES = (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99))


def commands_href(at_us: int, step_us: int, metric: str, where: FlowFilter) -> str:
    query = {"metric": metric, "from": str(at_us // 1_000_000),
             "to": str((at_us + step_us) // 1_000_000)}
    for key, value in (("org", where.org), ("binding", where.binding),
                       ("operation", where.operation)):
        if value:
            query[key] = value
    return "/admin/history/commands?" + urlencode(query)


def buckets(chosen: HistoryRange) -> list[int]:
    first = chosen.since_us - chosen.since_us % chosen.step_us
    return list(range(first, chosen.until_us, chosen.step_us))


def _histograms(points: Iterable[FlowPoint]) -> tuple[dict[int, LatencyHistogram],
                                                      dict[int, LatencyHistogram]]:
    """Per step bucket, the response (accept -> answer) and receipt (accept -> receipt)
    histograms: each one the sum of the rows over the other latency's bucket."""
    response: dict[int, dict[int, int]] = {}
    receipt: dict[int, dict[int, int]] = {}
    for p in points:
        if p.metric != RECEIPTED:
            continue
        a = response.setdefault(p.at_us, {})
        a[p.answer_le] = a.get(p.answer_le, 0) + p.n
        r = receipt.setdefault(p.at_us, {})
        r[p.receipt_le] = r.get(p.receipt_le, 0) + p.n

    def hist(per: dict[int, dict[int, int]]) -> dict[int, LatencyHistogram]:
        return {at: LatencyHistogram(tuple(sorted(c.items()))) for at, c in per.items()}

    return hist(response), hist(receipt)


def _quantiles(h: LatencyHistogram) -> dict[str, float | None]:
    return {name: h.percentile_ms(q) for name, q in QUANTILES}


def flow_doc(points: list[FlowPoint], chosen: HistoryRange,
             where: FlowFilter) -> dict[str, Any]:
    """``pressure`` (per metric a count per bucket) and ``latency`` (per bucket the
    response and receipt percentiles, and over the whole range)."""
    steps = buckets(chosen)
    counts: dict[str, dict[int, int]] = {ACCEPTED: {}, RECEIPTED: {}}
    for p in points:
        per = counts.setdefault(p.metric, {})
        per[p.at_us] = per.get(p.at_us, 0) + p.n
    pressure: list[dict[str, Any]] = [{
        "series": name, "metric": metric, "color": color(name),
        "total": sum(counts[metric].values()),
        "points": [{"at_us": at, "at": fmt_iso(at), "count": counts[metric].get(at, 0),
                    "items": commands_href(at, chosen.step_us, metric, where)}
                   for at in steps],
    } for name, metric in PRESSURE_SERIES]
    response, receipt = _histograms(points)
    by_kind = {"response": response, "receipt": receipt}
    latency: dict[str, Any] = {}
    for kind, hists in by_kind.items():
        latency[kind] = {
            "range": {**_quantiles(LatencyHistogram.merged(hists.values())),
                      "count": sum(h.total for h in hists.values())},
            "points": [{"at_us": at, "at": fmt_iso(at),
                        "count": hists[at].total if at in hists else 0,
                        **(_quantiles(hists[at]) if at in hists
                           else {name: None for name, _ in QUANTILES}),
                        "items": commands_href(at, chosen.step_us, RECEIPTED, where)}
                       for at in steps],
        }
    accepted, confirmed = sum(counts[ACCEPTED].values()), sum(counts[RECEIPTED].values())
    return {"pressure": pressure, "backlog_change": accepted - confirmed, "latency": latency}


def latency_lines(doc: dict[str, Any]) -> list[tuple[str, bool, list[tuple[int, float | None,
                                                                           str, str]]]]:
    """The latency chart's lines: (name, dashed, [(at_us, ms or None, href, at text)])."""
    lines = []
    for name, kind, q in LATENCY_SERIES:
        key = next(k for k, v in QUANTILES if v == q)
        lines.append((name, q > 0.5, [(p["at_us"], p[key], p["items"], p["at"])
                                      for p in doc["latency"][kind]["points"]]))
    return lines


def pressure_lines(doc: dict[str, Any]) -> list[tuple[str, bool, list[tuple[int, float | None,
                                                                            str, str]]]]:
    return [(s["series"], False, [(p["at_us"], float(p["count"]), p["items"], p["at"])
                                  for p in s["points"]]) for s in doc["pressure"]]
