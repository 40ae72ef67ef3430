"""Real Prometheus, not only its client (issue 23 item 7).

Debian's ``prometheus`` package gives ``promtool`` and the server (``make prometheus``
installs it). ``promtool`` checks the shipped alert rules and lints a live replica's
``/metrics``; a real Prometheus server scrapes two real ``integrationd run`` processes,
evaluates ``docs/alerts.yml`` against a staged failure (dead items) until the matching
alerts fire, and runs every query of ``docs/grafana-dashboard.json`` against what the
replicas really export.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon.core.states import WorkState
from sandbox.ports import free_port
from storage.port import WorkQuery
from tests.support.backends import fresh_database
from tests.support.harness import wait_for
from tests.support.processes import ReplicaProcess, start_replica, stop_all, write_config
from tests.support.work import enqueue

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "docs" / "alerts.yml"
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"
METRIC = re.compile(r"\bintegrationd_[a-z_]+[a-z]\b")


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path is not None, f"{name} is not installed: run `make prometheus` (Debian's prometheus)"
    return path


def _wall_us() -> int:
    return time.time_ns() // 1000


def test_promtool_accepts_every_shipped_alert_rule() -> None:
    rules = len(re.findall(r"^\s+- alert: ", ALERTS.read_text(), flags=re.MULTILINE))
    done = subprocess.run([_tool("promtool"), "check", "rules", str(ALERTS)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {rules} rules found" in done.stdout


def test_promtool_rejects_a_broken_rule_file(tmp_path: Path) -> None:
    """The check above can fail: a rule with a PromQL syntax error is refused."""
    broken = tmp_path / "broken.yml"
    broken.write_text(ALERTS.read_text().replace(") > 900", ") >> 900", 1))
    done = subprocess.run([_tool("promtool"), "check", "rules", str(broken)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "FAILED" in done.stdout + done.stderr


async def _promql(base: str, query: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as http:
        answer = (await http.get(f"{base}/api/v1/query", params={"query": query})).json()
    assert answer["status"] == "success", (query, answer)
    return list(answer["data"]["result"])


def _served_families(metrics_text: str) -> set[str]:
    """Every family a replica serves, sampled or not (``# TYPE`` lines), by the names a
    query uses: counters with ``_total``, histograms by their base name."""
    return set(re.findall(r"^# TYPE (\S+) ", metrics_text, flags=re.MULTILINE)) | {
        f"{name}_total" for name in
        re.findall(r"^# TYPE (\S+) counter$", metrics_text, flags=re.MULTILINE)}


def _base(name: str) -> str:
    return re.sub(r"_(bucket|count|sum)$", "", name)


STAGED = frozenset({"IntegrationdDlqGrowing", "IntegrationdDeadLetterRateHigh"})


def _rules_without_hold(tmp_path: Path, alerts: frozenset[str]) -> Path:
    """docs/alerts.yml with the ``for:`` hold of ``alerts`` set to 0s: the staged failure
    is real but the holds are minutes long. Every other rule keeps its shipped hold, so a
    condition that is briefly true under the burst (two SQLite replicas retrying on a busy
    database) is ``pending``, as in production, not ``firing``. Expressions and thresholds
    are exactly the shipped ones."""
    lines = ALERTS.read_text().splitlines(keepends=True)
    current = ""
    shortened: set[str] = set()
    for i, line in enumerate(lines):
        named = re.match(r"^\s+- alert: (\S+)\s*$", line)
        if named:
            current = named.group(1)
        elif current in alerts and re.match(r"^\s+for: \S+\s*$", line):
            lines[i] = re.sub(r"for: \S+", "for: 0s", line)
            shortened.add(current)
    assert shortened == alerts, f"no `for:` hold found for {sorted(alerts - shortened)}"
    path = tmp_path / "alerts.yml"
    path.write_text("".join(lines))
    return path


async def _start_prometheus(tmp_path: Path, targets: list[str]) -> tuple[trio.Process, str]:
    port = free_port()
    rules = _rules_without_hold(tmp_path, STAGED)
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "integrationd",
                            "static_configs": [{"targets": targets}]}],
    }))
    log = (tmp_path / "prometheus.log").open("wb")
    proc = await trio.lowlevel.open_process(
        [_tool("prometheus"), f"--config.file={config}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=log,
    )
    log.close()
    base = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        if proc.returncode is not None:
            raise AssertionError("prometheus exited:\n"
                                 + (tmp_path / "prometheus.log").read_text()[-3000:])
        try:
            async with httpx.AsyncClient(timeout=2) as http:
                return (await http.get(f"{base}/-/ready")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_for(ready, within_s=60)
    return proc, base


async def _alerts(base: str, state: str) -> dict[str, set[str]]:
    """The alerts in ``state`` (``pending`` or ``firing``), each with its families."""
    async with httpx.AsyncClient(timeout=10) as http:
        alerts = (await http.get(f"{base}/api/v1/alerts")).json()["data"]["alerts"]
    found: dict[str, set[str]] = {}
    for alert in alerts:
        if alert["state"] == state:
            found.setdefault(alert["labels"]["alertname"], set()).add(
                alert["labels"].get("family", ""))
    return found


async def _firing(base: str) -> dict[str, set[str]]:
    return await _alerts(base, "firing")


async def test_real_prometheus_scrapes_two_replicas_and_fires_on_dead_items(
    tmp_path: Path,
) -> None:
    async with fresh_database("sqlite", tmp_path) as database:
        store = await database.open_store()
        # One attempt per item: a failing handler makes it dead at once.
        cfg = write_config(tmp_path / "replica.toml", database.url)
        cfg.write_text(cfg.read_text().replace("max_attempts = 5", "max_attempts = 1"))
        replicas: list[ReplicaProcess] = []
        prometheus: trio.Process | None = None
        try:
            for name in ("a", "b"):
                replicas.append(await start_replica(cfg, name))
            targets = [urllib.parse.urlsplit(r.admin).netloc for r in replicas]
            prometheus, base = await _start_prometheus(tmp_path, targets)

            async def both_up() -> bool:
                up = await _promql(base, 'up{job="integrationd"} == 1')
                return {s["metric"]["instance"] for s in up} == set(targets)

            await wait_for(both_up, within_s=60)
            # Not even pending: no rule's condition holds on a healthy, idle cluster,
            # whatever its hold.
            assert await _firing(base) == {}, "an alert fires on a healthy, idle cluster"
            assert await _alerts(base, "pending") == {}, "an alert is pending when idle"

            # Wave 1: dead items until every replica exports its dead counter, so that
            # Prometheus has a baseline sample of each series before the burst.
            dead_series = 'integrationd_work_finalized_total{family="noop",outcome="dead"}'

            async def every_replica_counts_dead() -> bool:
                counted = [dead_series in (await r.get("/metrics"))[1].decode()
                           for r in replicas]
                if not all(counted):
                    await enqueue(store, 2, now=_wall_us(), payload='{"fail_attempts": 9}')
                    await trio.sleep(0.5)
                return all(counted)

            async def prometheus_has_both_series() -> bool:
                dead = await _promql(base, dead_series)
                return {s["metric"]["instance"] for s in dead} == set(targets)

            await wait_for(every_replica_counts_dead, within_s=90)
            await wait_for(prometheus_has_both_series, within_s=30)
            assert "IntegrationdDlqGrowing" not in await _firing(base), "fired before the burst"
            # Wave 2: 60 more dead items; the DLQ grows by more than the rule's 50.
            await enqueue(store, 60, now=_wall_us(), payload='{"fail_attempts": 9}')

            async def dlq_alerts_fire() -> bool:
                firing = await _firing(base)
                return ("noop" in firing.get("IntegrationdDlqGrowing", set())
                        and "noop" in firing.get("IntegrationdDeadLetterRateHigh", set()))

            await wait_for(dlq_alerts_fire, within_s=90)
            firing = await _firing(base)
            # Only the staged failure fires: nothing else is wrong with this cluster. A
            # rule the burst makes briefly true stays pending behind its shipped hold.
            assert set(firing) == STAGED, await _alerts(base, "pending")
            grown = await _promql(base, 'sum(increase(integrationd_work_finalized_total'
                                  '{outcome="dead"}[1h]))')
            assert float(grown[0]["value"][1]) > 50

            # The dashboard: every query is valid PromQL on this server, and every metric
            # it names is one the replicas really serve.
            status, body = await replicas[0].get("/metrics")
            assert status == 200
            served = _served_families(body.decode())
            dashboard = json.loads(DASHBOARD.read_text())
            exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
            assert len(exprs) > 10
            for expr in exprs:
                query = expr.replace("$__rate_interval", "1m").replace("$family", ".*")
                await _promql(base, query)
                for name in METRIC.findall(expr):
                    assert _base(name) in served or name in served, (name, expr)
            # The cluster-wide dead depth (sampled by the replicas from the database)
            # reaches every dead item.
            async def all_finalized() -> bool:
                return await store.work_count_open() == 0

            await wait_for(all_finalized, within_s=60)
            dead_now = len(await store.work_list(WorkQuery(state=WorkState.DEAD, limit=1000)))
            assert dead_now > 60

            async def depth_counts_every_dead_item() -> bool:
                depth = await _promql(base, "max by (family) (integrationd_work_queue_depth"
                                      '{state="dead"})')
                return any(s["metric"].get("family") == "noop"
                           and float(s["value"][1]) == dead_now for s in depth)

            await wait_for(depth_counts_every_dead_item, within_s=30)
            # The alert rules name served metrics too.
            for name in METRIC.findall(ALERTS.read_text()):
                assert _base(name) in served or name in served, name
        finally:
            if prometheus is not None and prometheus.returncode is None:
                prometheus.kill()
                await prometheus.wait()
            await stop_all(replicas)
            await database.close_all()


async def test_promtool_lints_a_live_replicas_metrics(tmp_path: Path) -> None:
    async with fresh_database("sqlite", tmp_path) as database:
        cfg = write_config(tmp_path / "replica.toml", database.url)
        replica = await start_replica(cfg, "lint")
        try:
            status, body = await replica.get("/metrics")
            assert status == 200 and b"integrationd_build_info" in body
            done = await trio.run_process([_tool("promtool"), "check", "metrics"],
                                          stdin=body, capture_stdout=True,
                                          capture_stderr=True, check=False)
            assert done.returncode == 0, (done.stdout + done.stderr).decode()
            assert done.stdout.strip() == b"" and done.stderr.strip() == b""
        finally:
            await stop_all([replica])
            await database.close_all()
