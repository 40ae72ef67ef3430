"""The overview's read model: pressure, throughput, series, flow, counters, replicas.

Theory of operation
-------------------
Nothing here scans the work table. Pressure, throughput and the effect flow
come from the replica's ``history``: one bounded depth query, one outcome
count and one flow sample (:mod:`storage.flow`) per
``work.depth_sample_interval``, taken by the replica's depth sampler whether
or not anyone looks. The overview adds one query on the small ``replicas``
table and this replica's own counters (claims, contention, lease losses),
which are *per replica*: the page says so.

Every rate over "the window" is computed once, here, from the same samples
(:func:`window`): the newest samples whose intervals add up to at most
:data:`THROUGHPUT_WINDOW_S`. The "finished/s" figure, the per-family legends
and the outcomes table all read that one window, so they cannot disagree; the
charts plot one rate per sample interval.

When that one query fails the overview still answers, from memory, with
``database: "unreachable"`` (the page shows a banner).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from admin_ui.serialize import replica_json
from admin_ui.view import ReplicaView
from daemon.core.latency import LatencyHistogram
from daemon.services import logs
from storage.port import StorageError

if TYPE_CHECKING:
    from admin_ui.view import HistoryPoint, MetricSample

SERIES_POINTS = 180
THROUGHPUT_WINDOW_S = 60.0
REPLICAS_SEEN_S = 3600
# Finished-work outcomes that count as throughput (a retry is not finished work).
FINAL_OUTCOMES = ("succeeded", "skipped", "dead", "cancelled")
# Lines every family's charts draw, even at zero, so a retry storm or new dead work shows.
ALWAYS_STATES = ("pending", "processing", "retry", "dead")
ALWAYS_OUTCOMES = ("succeeded", "retry", "dead")
STATE_ORDER = ("pending", "processing", "retry", "dead", "awaiting_legacy_outcome",
               "legacy_outcome_unknown")
OUTCOME_ORDER = ("succeeded", "skipped", "cancelled", "retry", "deferred", "dead")
EFFECT_OUTCOMES = ("ACCEPTED", "REJECTED", "RETRYABLE_PRE_DISPATCH", "REPLAY_SAFE_RETRY",
                   "OUTCOME_UNKNOWN")
ALWAYS_EFFECTS = ("ACCEPTED", "REJECTED", "OUTCOME_UNKNOWN")


def _latest(history: list[HistoryPoint]) -> HistoryPoint | None:
    return history[-1] if history else None


def pressure(point: HistoryPoint | None) -> list[dict[str, Any]]:
    """Depth and oldest age per family x state, as of the latest sample."""
    if point is None:
        return []
    rows = []
    for d in sorted(point.depths, key=lambda d: (d.family, d.state.value)):
        age = None
        if d.oldest_run_after_us is not None:
            age = round(max(0.0, (point.at_us - d.oldest_run_after_us) / 1_000_000), 1)
        rows.append({"family": d.family, "state": d.state.value, "depth": d.count,
                     "depth_capped": d.capped, "oldest_age_s": age})
    return rows


def window(history: list[HistoryPoint], window_s: float) -> tuple[list[HistoryPoint], float]:
    """The newest samples whose intervals add up to at most ``window_s`` (at least one),
    and their span in seconds: the one window every "per second" figure uses."""
    chosen: list[HistoryPoint] = []
    span = 0.0
    for point in reversed(history):
        if chosen and span + point.interval_s > window_s:
            break
        chosen.append(point)
        span += point.interval_s
    chosen.reverse()
    return chosen, span


def _rate(count: float, span: float) -> float:
    return round(count / span, 3) if span > 0 else 0.0


def throughput(history: list[HistoryPoint], window_s: float) -> dict[str, Any]:
    """Outcomes finished (cluster-wide) over the window; ``per_s`` counts finished work
    only (a retry is an execution that did not finish the item)."""
    points, span = window(history, window_s)
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for point in points:
        for c in point.finished:
            counts[(c.family, c.outcome)] += c.count
    by_outcome = [
        {"family": f, "outcome": o, "count": n, "per_s": _rate(n, span),
         "finished": o in FINAL_OUTCOMES}
        for (f, o), n in sorted(counts.items())
    ]
    finished = sum(n for (_, o), n in counts.items() if o in FINAL_OUTCOMES)
    return {
        "window_s": round(span, 1),
        "finished": finished,
        "per_s": _rate(finished, span),
        "by_outcome": by_outcome,
    }


def claim_rate(history: list[HistoryPoint], window_s: float) -> dict[str, Any]:
    """WorkItems this replica claimed over the throughput window, and per second (None
    before the first sample: nothing is known yet)."""
    points, span = window(history, window_s)
    claimed = sum(p.claims for p in points)
    return {"window_s": round(span, 1), "claimed": claimed,
            "per_s": _rate(claimed, span) if points else None}


def series(history: list[HistoryPoint], points: int = SERIES_POINTS) -> list[dict[str, Any]]:
    """Per sample: total depth per state, and finished work per second."""
    out = []
    for point in history[-points:]:
        depth: dict[str, int] = defaultdict(int)
        for d in point.depths:
            depth[d.state.value] += d.count
        finished = sum(c.count for c in point.finished if c.outcome in FINAL_OUTCOMES)
        out.append({
            "at_us": point.at_us,
            "depth": dict(sorted(depth.items())),
            "finished_per_s": _rate(finished, point.interval_s),
        })
    return out


def _ordered(names: set[str], order: tuple[str, ...]) -> list[str]:
    return [n for n in order if n in names] + sorted(names - set(order))


def family_charts(history: list[HistoryPoint], names: list[str], window_s: float,
                  points: int = SERIES_POINTS) -> list[dict[str, Any]]:
    """Per family: depth by state and finished/s by outcome per sample, and the window's
    rate per outcome (the legend figures)."""
    recent = history[-points:]
    win, span = window(history, window_s)
    families = set(names)
    for point in recent:
        families.update(d.family for d in point.depths)
        families.update(c.family for c in point.finished)
    out = []
    for family in sorted(families):
        states = set(ALWAYS_STATES)
        outcomes = set(ALWAYS_OUTCOMES)
        rows = []
        for point in recent:
            depth = {d.state.value: d.count for d in point.depths if d.family == family}
            done = {c.outcome: c.count for c in point.finished if c.family == family}
            states.update(depth)
            outcomes.update(done)
            rows.append((point, depth, done))
        state_list = _ordered(states, STATE_ORDER)
        outcome_list = _ordered(outcomes, OUTCOME_ORDER)
        totals: dict[str, int] = defaultdict(int)
        for point in win:
            for c in point.finished:
                if c.family == family:
                    totals[c.outcome] += c.count
        latest_depth = rows[-1][1] if rows else {}
        out.append({
            "family": family,
            "states": state_list,
            "outcomes": outcome_list,
            "depth_now": {s: latest_depth.get(s, 0) for s in state_list},
            "per_s_window": {o: _rate(totals.get(o, 0), span) for o in outcome_list},
            "series": [
                {"at_us": p.at_us,
                 "depth": {s: depth.get(s, 0) for s in state_list},
                 "per_s": {o: _rate(done.get(o, 0), p.interval_s) for o in outcome_list}}
                for p, depth, done in rows
            ],
        })
    return out


def _latency(response: LatencyHistogram, receipt: LatencyHistogram) -> dict[str, Any]:
    return {
        "samples": receipt.total,
        "response_p50_ms": response.percentile_ms(0.5),
        "response_p99_ms": response.percentile_ms(0.99),
        "receipt_p50_ms": receipt.percentile_ms(0.5),
        "receipt_p99_ms": receipt.percentile_ms(0.99),
    }


def flow(history: list[HistoryPoint], window_s: float,
         points: int = SERIES_POINTS) -> dict[str, Any]:
    """The effect path (cluster-wide): commands accepted, provider answers by outcome
    class and receipts confirmed per second, and end-to-end latency (accept -> provider
    response, accept -> receipt confirmed; p50/p99 in ms), over the window and per sample."""
    win, span = window(history, window_s)
    effects: dict[str, int] = defaultdict(int)
    for point in win:
        for outcome, n in point.flow.effects:
            effects[outcome] += n
    seen = set(effects)
    for point in history[-points:]:
        seen.update(o for o, _ in point.flow.effects)
    outcome_list = _ordered(seen | set(ALWAYS_EFFECTS), EFFECT_OUTCOMES)
    return {
        "window_s": round(span, 1),
        "accepted_per_s": _rate(sum(p.flow.accepted for p in win), span),
        "effects_per_s": {o: _rate(effects.get(o, 0), span) for o in outcome_list},
        "receipts_per_s": _rate(sum(p.flow.receipts_confirmed for p in win), span),
        "latency": _latency(LatencyHistogram.merged(p.flow.to_response for p in win),
                            LatencyHistogram.merged(p.flow.to_receipt for p in win)),
        "outcomes": outcome_list,
        "series": [
            {"at_us": p.at_us,
             "accepted_per_s": _rate(p.flow.accepted, p.interval_s),
             "effects_per_s": {o: _rate(dict(p.flow.effects).get(o, 0), p.interval_s)
                               for o in outcome_list},
             "receipts_per_s": _rate(p.flow.receipts_confirmed, p.interval_s),
             **_latency(p.flow.to_response, p.flow.to_receipt)}
            for p in history[-points:]
        ],
    }


def local_counters(samples: list[MetricSample]) -> dict[str, Any]:
    """This replica's claim counters (since it started), from its metrics registry."""
    by_family: dict[str, dict[str, float]] = {
        "claimed": {}, "claim_contention": {}, "lease_lost": {}, "expired_dead": {},
        "in_flight": {},
    }
    finalized: list[dict[str, Any]] = []
    names = {
        "integrationd_work_claimed_total": "claimed",
        "integrationd_work_claim_contention_total": "claim_contention",
        "integrationd_work_lease_lost_total": "lease_lost",
        "integrationd_work_expired_dead_total": "expired_dead",
        "integrationd_work_in_flight": "in_flight",
    }
    for s in samples:
        key = names.get(s.name)
        if key is not None:
            by_family[key][s.labels.get("family", "")] = s.value
        elif s.name == "integrationd_work_finalized_total":
            finalized.append({"family": s.labels.get("family", ""),
                              "outcome": s.labels.get("outcome", ""), "count": s.value})
    doc: dict[str, Any] = {k: dict(sorted(v.items())) for k, v in by_family.items()}
    doc["totals"] = {k: sum(v.values()) for k, v in by_family.items()}
    doc["finalized"] = sorted(finalized, key=lambda r: (r["family"], r["outcome"]))
    return doc


async def replicas(view: ReplicaView) -> list[dict[str, Any]]:
    now = view.clock.now_us()
    infos = await view.store.replica_list(now - REPLICAS_SEEN_S * 1_000_000)
    interval = view.settings.replica.heartbeat_interval
    return [replica_json(i, now, interval) for i in infos]


# The charted read models of the last history seen: (key, (families, flow, series)). They depend
# on the history alone, which changes once per sample interval, while every console tab
# polls once per interval too: computing them once per sample keeps a page view cheap.
_charted_cache: list[tuple[tuple[int, int, int], tuple[Any, Any, Any]]] = []


def _charted(view: ReplicaView, history: list[HistoryPoint]
             ) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    key = (id(view.history), len(history), history[-1].at_us if history else 0)
    if _charted_cache and _charted_cache[0][0] == key:
        families, effect_flow, totals = _charted_cache[0][1]
        return families, effect_flow, totals
    value = (family_charts(history, view.registry.names(), THROUGHPUT_WINDOW_S),
             flow(history, THROUGHPUT_WINDOW_S), series(history))
    _charted_cache[:] = [(key, value)]
    return value


async def overview(view: ReplicaView) -> dict[str, Any]:
    history = list(view.history)
    latest = _latest(history)
    now = view.clock.now_us()
    database = "ok"
    seen: list[dict[str, Any]] | None
    kept: dict[str, Any] | None = None
    try:
        seen = await replicas(view)
        kept = await retention(view)
    except StorageError as exc:
        logs.warn("admin_overview_storage_error", error=str(exc))
        seen, database = None, "unreachable"
    ready, _ = view.readiness()
    families, effect_flow, totals = _charted(view, history)
    return {
        "replica": {"id": view.replica_id, "state": view.state, "ready": ready},
        "database": database,
        "now_us": now,
        "sample": {
            "at_us": latest.at_us if latest else None,
            "age_s": round((now - latest.at_us) / 1_000_000, 1) if latest else None,
            "interval_s": view.settings.work.depth_sample_interval,
        },
        "pressure": pressure(latest),
        "throughput": throughput(history, THROUGHPUT_WINDOW_S),
        "series": totals,
        "families": families,
        "flow": effect_flow,
        "local": local_counters(list(view.counter_samples())),
        "claims": claim_rate(history, THROUGHPUT_WINDOW_S),
        "replicas": seen,
        "retention": kept,
    }


async def retention(view: ReplicaView) -> dict[str, Any] | None:
    """The pruner's last pass and its lease (one primary-key read); None before any."""
    status = await view.store.retention_status()
    if status is None:
        return None
    now = view.clock.now_us()
    last = status.last_pass
    at = status.last_pass_at_us or None
    return {
        "enabled": view.settings.retention.enabled,
        "holder": status.holder if status.until_us >= now else None,
        "last_pass_at_us": at,
        "last_pass_age_s": None if at is None else round((now - at) / 1_000_000, 1),
        "last_pass_by": last.get("holder"),
        "result": last.get("result"),
        "tables": {name: {"pruned": int(t.get("pruned", 0)), "lag_s": int(t.get("lag_s", 0))}
                   for name, t in sorted(last.get("tables", {}).items())},
    }
