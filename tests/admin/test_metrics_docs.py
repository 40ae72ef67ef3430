"""docs/metrics.md documents every exported metric; alerts and the dashboard use only
documented metrics (exported, or listed as planned)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from daemon.services.metrics import Metrics
from storage.port import DbStats

DOCS = Path(__file__).resolve().parents[2] / "docs"
NAME = re.compile(r"\bintegrationd_[a-z_]+[a-z]\b")


def _exported() -> set[str]:
    metrics = Metrics()
    metrics.attach_db("sqlite", DbStats())
    names = set()
    for family in metrics.registry.collect():
        for sample in family.samples:
            name = re.sub(r"_(bucket|count|sum|created)$", "", sample.name)
            names.add(name)
    names.discard("integrationd_work_execution_seconds_created")
    return names


def _documented() -> set[str]:
    return set(NAME.findall((DOCS / "metrics.md").read_text()))


def _base(name: str) -> str:
    return re.sub(r"_(bucket|count|sum)$", "", name)


def test_every_exported_metric_is_documented() -> None:
    exported = _exported()
    assert exported, "no metrics found"
    assert exported - _documented() == set()


def test_alerts_and_dashboard_use_documented_metrics() -> None:
    documented = _documented()
    alerts = (DOCS / "alerts.yml").read_text()
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    for text in (alerts, exprs):
        used = {_base(n) for n in NAME.findall(text)}
        assert used, "no metrics referenced"
        assert used - documented == set()
    # The effect backlog is live now; the ingress metric is still planned.
    assert "integrationd_effect_outcome_unknown_backlog" in alerts
    assert "integrationd_effect_outcome_unknown_backlog" in _exported()
    planned = "integrationd_ingress_rejected_total"
    assert planned in alerts and planned not in _exported()
    assert alerts.count("PLANNED") >= 2



def _served_families() -> set[str]:
    """Every metric family the registry serves, with or without samples yet (a labelled
    counter that never fired has no sample, but is still served once it does)."""
    metrics = Metrics()
    metrics.attach_db("sqlite", DbStats())
    return {f"{f.name}_total" if f.type == "counter" else f.name
            for f in metrics.registry.collect()}


def test_documented_metrics_match_what_is_served() -> None:
    """The other direction: every metric table row of docs/metrics.md names a family
    /metrics really serves, except the rows under "Planned", which must not be served
    (a metric that ships moves out of that table)."""
    text = (DOCS / "metrics.md").read_text()
    live, _, planned = text.partition("## Planned")
    row = re.compile(r"^\| `(integrationd_[a-z_]+)`", flags=re.MULTILINE)
    live_rows, planned_rows = set(row.findall(live)), set(row.findall(planned))
    assert live_rows, "no metric rows found"
    served = _served_families()
    assert live_rows - served == set()
    assert planned_rows & served == set()
