"""The overview's read model: pressure, throughput, series, counters, replicas.

Theory of operation
-------------------
Nothing here scans the work table. Pressure and throughput come from the
replica's ``history``: one bounded depth query and one outcome count per
``work.depth_sample_interval``, taken by the replica's depth sampler whether
or not anyone looks. The overview adds one query on the small ``replicas``
table and this replica's own counters (claims, contention, lease losses),
which are *per replica*: the page says so.

When that one query fails the overview still answers, from memory, with
``database: "unreachable"`` (the page shows a banner).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from admin_ui.serialize import replica_json
from admin_ui.view import ReplicaView
from daemon.services import logs
from storage.port import StorageError

if TYPE_CHECKING:
    from admin_ui.view import HistoryPoint, MetricSample

SERIES_POINTS = 180
THROUGHPUT_WINDOW_S = 60.0
REPLICAS_SEEN_S = 3600
# Finished-work outcomes that count as throughput (a retry is not finished work).
FINAL_OUTCOMES = ("succeeded", "skipped", "dead", "cancelled")


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
                     "oldest_age_s": age})
    return rows


def throughput(history: list[HistoryPoint], window_s: float) -> dict[str, Any]:
    """Outcomes finished (cluster-wide) over the last ``window_s`` of samples."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    span = 0.0
    for point in reversed(history):
        if span >= window_s:
            break
        span += point.interval_s
        for c in point.finished:
            counts[(c.family, c.outcome)] += c.count
    by_outcome = [
        {"family": f, "outcome": o, "count": n,
         "per_s": round(n / span, 3) if span > 0 else 0.0}
        for (f, o), n in sorted(counts.items())
    ]
    finished = sum(n for (_, o), n in counts.items() if o in FINAL_OUTCOMES)
    return {
        "window_s": round(span, 1),
        "finished": finished,
        "per_s": round(finished / span, 3) if span > 0 else 0.0,
        "by_outcome": by_outcome,
    }


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
            "finished_per_s": round(finished / point.interval_s, 3) if point.interval_s else 0.0,
        })
    return out


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


async def overview(view: ReplicaView) -> dict[str, Any]:
    history = list(view.history)
    latest = _latest(history)
    now = view.clock.now_us()
    database = "ok"
    seen: list[dict[str, Any]] | None
    try:
        seen = await replicas(view)
    except StorageError as exc:
        logs.warn("admin_overview_storage_error", error=str(exc))
        seen, database = None, "unreachable"
    ready, _ = view.readiness()
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
        "series": series(history),
        "local": local_counters(list(view.counter_samples())),
        "replicas": seen,
    }
