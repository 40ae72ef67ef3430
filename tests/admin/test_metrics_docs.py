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
