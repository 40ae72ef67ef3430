"""docs/metrics.md documents exactly what /metrics exports (names, types, labels); alerts
and the dashboard use only documented metrics (exported, or listed as planned)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

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


ROW = re.compile(r"^\| `(integrationd_[a-z_]+)` \| (\w+) \| ([^|]*) \|", re.MULTILINE)


def _exported_shapes() -> dict[str, tuple[str, set[str]]]:
    """name (as scraped, counters with ``_total``) -> (type, label names)."""
    metrics = Metrics()
    # One transaction seen, so the per-operation families have a sample (and labels).
    metrics.attach_db("sqlite", DbStats(durations={"work.claim": [1, 0.01]}))
    shapes: dict[str, tuple[str, set[str]]] = {}
    for family in metrics.registry.collect():
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        suffix = "_total" if family.type == "counter" else ""
        shapes[family.name + suffix] = (family.type, labels)
    # Labelled metrics nobody touched yet have no samples: take their declared labels.
    for obj in vars(metrics).values():
        if isinstance(obj, MetricWrapperBase):
            suffix = "_total" if obj._type == "counter" else ""
            kind, _ = shapes[obj._name + suffix]
            shapes[obj._name + suffix] = (kind, set(obj._labelnames))
    return shapes


def _documented_shapes() -> dict[str, tuple[str, set[str]]]:
    """The tables above "## Planned": name -> (type, label names)."""
    text = (DOCS / "metrics.md").read_text().split("## Planned")[0]
    return {name: (kind, set(re.findall(r"`(\w+)`", labels)))
            for name, kind, labels in ROW.findall(text)}


def test_metrics_md_tables_match_the_export_exactly() -> None:
    exported, documented = _exported_shapes(), _documented_shapes()
    assert len(documented) > 20, "the tables were not parsed"
    assert set(documented) - set(exported) == set(), "documented but not exported"
    assert set(exported) - set(documented) == set(), "exported but not documented"
    for name, shape in exported.items():
        assert documented[name] == shape, name


def test_no_created_series_and_build_info_is_exported() -> None:
    metrics = Metrics()
    metrics.count_admission("command", "COMMAND_ACCEPTED", True)
    metrics.count_receipt("confirmed")
    metrics.finalized.labels("noop", "succeeded").inc()
    text = metrics.render().decode()
    assert "_created" not in text
    assert re.search(r'^integrationd_build_info\{python="[0-9.]+",version="[^"]+"\} 1\.0$',
                     text, re.MULTILINE)
    assert ('integrationd_command_admissions_total{request="command",result="accepted"} 1.0'
            in text)
    assert 'integrationd_receipt_deliveries_total{result="confirmed"} 1.0' in text


def test_an_unknown_receipt_result_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="unknown receipt result 'maybe'"):
        Metrics().count_receipt("maybe")


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
    # The effect backlog and webhook ingress are live: their alerts use exported metrics.
    for name in ("integrationd_effect_outcome_unknown_backlog",
                 "integrationd_ingress_rejections_total", "integrationd_ingress_spool_depth",
                 "integrationd_ingress_spool_oldest_received_seconds"):
        assert name in alerts and name in _exported(), name
    assert "PLANNED" not in alerts



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


def test_grant_reasons_are_a_fixed_label_set_always_present() -> None:
    metrics = Metrics()
    text = metrics.render().decode()
    for reason in ("invalid_grant", "refresh_token_possibly_spent", "refresh_in_doubt",
                   "no_refresh_token", "invalid_jwt", "unrecorded"):
        assert (f'integrationd_grants_needing_reauthorization{{reason="{reason}"}} 0.0'
                in text), reason
    metrics.set_grant_reasons({"invalid_grant": 2, "some_future_code": 1})
    text = metrics.render().decode()
    assert 'integrationd_grants_needing_reauthorization{reason="invalid_grant"} 2.0' in text
    assert 'integrationd_grants_needing_reauthorization{reason="unrecorded"} 1.0' in text
    assert "some_future_code" not in text  # never a label outside the fixed set
    metrics.set_grant_reasons({})
    assert ('integrationd_grants_needing_reauthorization{reason="invalid_grant"} 0.0'
            in metrics.render().decode())
