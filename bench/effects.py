"""Effects benchmark: the Lead.Title slice end to end, R replicas on MariaDB.

    python -m bench.effects --replicas 4 --effects 5000

One reference Runtime per replica (each its own org and scope, the way a
multi-tenant deployment looks), all served with the HubSpot simulator from
this process; R ``integrationd run`` processes, each serving the /v1 API its
Runtime calls. Every Runtime gets effects/R title changes over its Leads at
once; the run ends when every intent is COMMITTED (command accepted -> PATCH
-> receipt confirmed). Prints one JSON line with effects/s, commits and
statements per effect on the integrationd side (from each replica's
/metrics), duplicate PATCHes (applied PATCHes minus effects), then the kernel
benchmark's noop figure in the same run and the ratio.

In the same run, after integrationd's replicas have stopped, the same workload
goes through the naive peer (``bench/effects_peer.py``: procrastinate jobs on
the local PostgreSQL, each sending the same PATCH with httpx and the same
receipt POST, no journal, no fence), against the same simulator and the same
reference Runtime code (fresh Runtimes pointed at the peer's intake). The one
JSON line then also holds ``peer`` (its effects/s, duplicate PATCHes, CPU per
effect by process group) and ``peer_ratio`` (integrationd's effects/s over the
peer's). ``--no-peer`` skips it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import attrs
import trio

from bench import pairs
from bench.effects_peer import apply_schema
from bench.kernel import (
    PG_DSN,
    REPO,
    bench_integrationd,
    cpu_seconds,
    fresh_url,
    mariadb_pid,
    mysql_admin,
    peak_rss_mb,
    scrape,
    start_replica,
    wait_admin,
)
from bench.l1_copy import l1_copy
from config.catalog import load_catalog
from config.load import load_settings
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.identity import integration_scope_digest
from daemon.services.catalog_view import publish_current
from daemon.services.families import known_family_names
from daemon.services.http_server import DEFAULT_KEEP_ALIVE_S
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.ports import free_port
from sandbox.runtime import ReferenceRuntime
from sandbox.runtime.server import serve as serve_runtime
from storage.migrate import migrate
from storage.open import open_store

HUBSPOT_TOKEN = "bench-hubspot-token"
REVISION = 7
# The peer run gives up once no intent was committed for this long (a job failed for good).
PEER_STALL_S = 120.0


def scope_of(i: int) -> TrustedRuntimeWorkScope:
    return TrustedRuntimeWorkScope(f"org-{i}", f"install-{i}", "cap.leads", f"sha256:bench-{i}")


# --provider-limit: one L1 dimension of that many requests a second, counted against one
# provider key that every replica's binding shares (one provider app, R replicas).
PROVIDER_DIMENSION = "per_second"
PROVIDER_KEY = "bench-app"


def provider_quota(limit: int, jitter_s: float) -> str:
    """The L1 table of ``--provider-limit``: ``limit`` requests per second."""
    return (f"[quota.{PROVIDER_DIMENSION}]\nlimit = {limit}\nwindow = 1.0\n"
            f'scope = "app_installation"\nkind = "sliding"\njitter = {jitter_s}\n')


def write_config(workdir: Path, url: str, i: int, replicas: int, api_ports: list[int],
                 runtime_ports: list[int], sim_port: int,
                 definitions: Path | None = None, *, provider_limit: int = 0,
                 provider_jitter_s: float = 0.25, max_attempts: int = 0,
                 batch_receipts: bool = True) -> Path:
    """Replica ``i``'s configuration; ``definitions``: the L1 copy to serve (default: the
    shipped definitions without their providers' quota, or with only ``provider_limit``
    requests a second shared by every binding when that is set)."""
    quota = {"hubspot": provider_quota(provider_limit, provider_jitter_s)} \
        if provider_limit else None
    l1 = definitions if definitions is not None else l1_copy(workdir / "l1", quota=quota)
    lines = [
        f'[storage]\nurl = "{url}"\npool_size = 16\n',
        '[admin]\nlisten = "127.0.0.1:0"\n',
        f'[api]\nlisten = "127.0.0.1:{api_ports[i]}"\n',
        "[replica]\ndrain_timeout = 10.0\n",
        # Its own L1 copy without the providers' quota: this measures the effect path, not
        # HubSpot's request limit (bench.quota measures quota; the peer has none either).
        f'[catalog]\nrevision = {REVISION}\ndefinitions_dir = "{l1}"\n',
        "[work]\npoll_interval = 0.1\n",
        "[families.external_effect]\nbatch_size = 64\nconcurrency = 128\n"
        + (f"max_attempts = {max_attempts}\n" if max_attempts else ""),
        "[families.runtime_receipt]\nbatch_size = 64\nconcurrency = 128\n",
    ]
    for r in range(replicas):
        sc = scope_of(r)
        lines.append(
            f'[[runtimes]]\nname = "crm{r}"\norg_id = "{sc.org_id}"\n'
            f'app_installation_id = "{sc.app_installation_id}"\n'
            f'runtime_capability_id = "{sc.runtime_capability_id}"\n'
            f'runtime_work_binding_digest = "{sc.runtime_work_binding_digest}"\n'
            f'results_url = "http://127.0.0.1:{runtime_ports[r]}/runtime/v1/results"\n'
            + (f'results_batch_url = "http://127.0.0.1:{runtime_ports[r]}'
               '/runtime/v1/results/batch"\n' if batch_receipts else "")
            # The reference Runtime's server (serve_app) keeps idle connections this long.
            + f'keep_alive = {DEFAULT_KEEP_ALIVE_S}\n'
        )
        lines.append(
            f'[[bindings]]\nbinding_id = "hubspot-{r}"\nprovider = "hubspot"\n'
            f'org_id = "{sc.org_id}"\napp_installation_id = "{sc.app_installation_id}"\n'
            f'remote_account_id = "portal-{r}"\nbase_url = "http://127.0.0.1:{sim_port}"\n'
            # Its token comes from the environment (secrets_env): a declared static token.
            'auth = "static_token"\n'
            + (f'[bindings.quota.{PROVIDER_DIMENSION}]\nscope = "provider_key"\n'
               f'key = "{PROVIDER_KEY}"\n' if provider_limit else "")
        )
    cfg = workdir / f"replica-{i}.toml"
    cfg.write_text("\n".join(lines))
    return cfg


def secrets_env(replicas: int) -> dict[str, str]:
    env = {}
    for r in range(replicas):
        env[f"INTEGRATIOND_RUNTIME_CRM{r}_TOKEN"] = f"bench-runtime-{r}"
        env[f"INTEGRATIOND_RUNTIME_CRM{r}_RESULTS_TOKEN"] = f"bench-results-{r}"
        env[f"INTEGRATIOND_BINDING_HUBSPOT_{r}_TOKEN"] = HUBSPOT_TOKEN
    return env


async def seed_links(url: str, replicas: int, leads: int) -> None:
    store = await open_store(url)
    await migrate(store.db, store.dialect, time.time_ns() // 1000)
    for r in range(replicas):
        sc = scope_of(r)
        scope = integration_scope_digest(sc.org_id, sc.app_installation_id, "hubspot",
                                         f"portal-{r}")
        for i in range(leads):
            await store.link_adopt(scope, "lead", f"lead-{i}", "contact", f"{r * 100000 + i}",
                                   actor="bench", role="admin", reason="bench seed",
                                   now_us=time.time_ns() // 1000)
    await store.db.aclose()


async def publish_catalog(url: str, config: Path) -> None:
    """Every replica serves the same revision (same bindings): publish it once."""
    store = await open_store(url)
    catalog = load_catalog(load_settings(str(config), known_families=known_family_names()))
    await publish_current(store, catalog, actor="bench", role="admin", reason="bench",
                          now_us=time.time_ns() // 1000)
    await store.db.aclose()


def runtimes_for(replicas: int, intake_ports: list[int]) -> list[ReferenceRuntime]:
    return [
        ReferenceRuntime(
            scope=scope_of(r), integration_url=f"http://127.0.0.1:{intake_ports[r]}",
            integration_token=f"bench-runtime-{r}", results_token=f"bench-results-{r}",
            catalog_revision=REVISION, poll_interval_s=0.05, dispatch_concurrency=32,
        )
        for r in range(replicas)
    ]


async def serve_runtimes(nursery: trio.Nursery, runtimes: list[ReferenceRuntime],
                         ports: list[int], leads: int) -> None:
    for r, rt in enumerate(runtimes):
        await nursery.start(serve_runtime, rt, "127.0.0.1", ports[r])
        for i in range(leads):
            rt.store.create_lead({"lead_id": f"lead-{i}", "title": "Engineer"})


async def run_workload(runtimes: list[ReferenceRuntime], effects: int, leads: int,
                       stall_s: float = 0.0) -> float:
    """Every Runtime changes effects/R titles at once; seconds until all are COMMITTED.
    ``stall_s``: give up (and return) once no intent was committed for that long (an
    intent whose work went dead never is); 0 waits up to 900 s."""
    per_runtime = effects // len(runtimes)
    total = per_runtime * len(runtimes)
    t0 = time.monotonic()
    for rt in runtimes:
        for n in range(per_runtime):
            rt.store.update_lead(f"lead-{n % leads}", {"title": f"Title {n}"})
        rt.wakeup.set()
    last, progress_at = -1, time.monotonic()
    with trio.fail_after(900):
        while True:
            done = sum(rt.store.stats()["intents_by_status"].get("COMMITTED", 0)
                       for rt in runtimes)
            if done >= total:
                break
            if done != last:
                last, progress_at = done, time.monotonic()
            elif stall_s and time.monotonic() - progress_at > stall_s:
                break
            await trio.sleep(0.05)
    return time.monotonic() - t0


def provider_figures(arrivals: list[float], limit: int, window_s: float = 1.0
                     ) -> dict[str, Any]:
    """What the provider saw of its limit while the backlog lasted (first to last
    arrival): ``limit_use`` = arrivals / what the limit allowed in that span, the windows
    of its own length (one starting at each arrival) that held more than the limit, the
    fullest one, and the longest gap between two arrivals (a stall)."""
    times = sorted(arrivals)
    if not times:
        return {"limit_use": 0.0, "windows_over": 0, "worst_window": 0, "longest_gap_s": 0.0,
                "span_s": 0.0}
    span = times[-1] - times[0]
    worst, over, j = 0, 0, 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] < start + window_s:
            j += 1
        worst = max(worst, j - i)
        over += (j - i) > limit
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # The provider's count in each whole window of the backlog, back to back from the
    # first arrival (the last, partial one left out): where the limit went unused.
    counts = [sum(1 for t in times if times[0] + k * window_s <= t
                  < times[0] + (k + 1) * window_s) for k in range(int(span // window_s))]
    return {"limit_use": round(len(times) / (limit * max(1.0, span / window_s)), 3),
            "window_counts": counts,
            "windows_under_90": sum(1 for c in counts if c < 0.9 * limit),
            "windows_over": over, "worst_window": worst,
            "longest_gap_s": round(max(gaps, default=0.0), 3), "span_s": round(span, 3)}


async def work_journal(url: str) -> dict[str, Any]:
    """The effects' end states and their executions by outcome and reason."""
    store = await open_store(url)

    async def read(tx: Any) -> dict[str, Any]:
        states = await tx.fetchall("SELECT state, COUNT(*) FROM work_items WHERE family = ?"
                                   " GROUP BY state", ("external_effect",))
        runs = await tx.fetchall(
            "SELECT e.outcome, COALESCE(e.reason, ''), COUNT(*) FROM work_executions e"
            " WHERE e.family = ? GROUP BY e.outcome, COALESCE(e.reason, '')",
            ("external_effect",))
        return {"items_by_state": {str(s): int(n) for s, n in states},
                "executions": {f"{o}:{r}" if r else str(o): int(n) for o, r, n in runs}}

    try:
        return dict(await store.db.transact(read, name="bench.journal", write=False))
    finally:
        await store.db.aclose()


def postgres_cpu() -> dict[int, float]:
    """CPU seconds so far of every PostgreSQL process (backends come and go)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip().startswith("postgres"):
                    out[int(entry.name)] = cpu_seconds(int(entry.name))
            except OSError:
                continue
    return out


async def drive(replicas: int, effects: int, leads: int, api_ports: list[int],
                runtime_ports: list[int], sim: HubSpotSimulator, sim_port: int,
                start_replicas: Any, stop_replicas: Any, peer: PeerPlan | None,
                results: dict[str, Any], provider_limit: int = 0, url: str = "") -> None:
    runtimes = runtimes_for(replicas, api_ports)
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, "127.0.0.1", sim_port)
        await serve_runtimes(nursery, runtimes, runtime_ports, leads)
        for r in range(replicas):
            for i in range(leads):
                sim.add_contact(f"{r * 100000 + i}", jobtitle="Engineer")
        admins, pids = await trio.to_thread.run_sync(start_replicas)
        before = [await trio.to_thread.run_sync(scrape, a) for a in admins]
        db_pid = mariadb_pid()
        cpu_before = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()),
                      cpu_seconds(db_pid) if db_pid else 0.0)
        # Under a provider limit, an intent whose work went dead is never committed: the
        # run ends once nothing was committed for a minute, and says so.
        elapsed = await run_workload(runtimes, effects, leads,
                                     stall_s=60.0 if provider_limit else 0.0)
        total = (effects // replicas) * replicas
        cpu_after = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()),
                     cpu_seconds(db_pid) if db_pid else 0.0)
        if provider_limit:
            committed = sum(rt.store.stats()["intents_by_status"].get("COMMITTED", 0)
                            for rt in runtimes)
            results["provider_limit"] = {
                "limit": f"{provider_limit} per 1 s, one key shared by {replicas} replicas",
                "committed": committed,
                **provider_figures([r.received_at for r in sim.requests
                                    if r.method == "PATCH"], provider_limit),
                **await work_journal(url),
            }
        after = [await trio.to_thread.run_sync(scrape, a) for a in admins]
        patches = [r for r in sim.requests if r.method == "PATCH"]
        results.update({
            "effects": total,
            "seconds": round(elapsed, 3),
            "effects_per_s": round(total / elapsed, 1),
            "commits_per_effect": round(sum(
                a["integrationd_db_commits_total"] - b["integrationd_db_commits_total"]
                for a, b in zip(after, before, strict=True)) / total, 3),
            "statements_per_effect": round(sum(
                a["integrationd_db_statements_total"] - b["integrationd_db_statements_total"]
                for a, b in zip(after, before, strict=True)) / total, 2),
            "patch_requests": len(patches),
            # TCP connections the provider simulator accepted for those requests (one
            # per pooled connection when keep-alive works; one per request when not).
            "provider_connections": sim.connections_accepted,
            "duplicate_patches": sum(1 for p in patches if p.applied) - total,
            # CPU milliseconds per effect, by who spent them (2 cores on this machine).
            "cpu_ms_per_effect": {
                "replicas": round(1000 * (sum(cpu_after[0]) - sum(cpu_before[0])) / total, 2),
                "sandbox_runtime_and_simulator": round(
                    1000 * (cpu_after[1] - cpu_before[1]) / total, 2),
                "mariadb": round(1000 * (cpu_after[2] - cpu_before[2]) / total, 2),
            },
            "runtime_counters": {
                k: sum(int(rt.store.stats().get(k, 0)) for rt in runtimes)
                for k, v in runtimes[0].store.stats().items() if isinstance(v, int)
            },
        })
        # The replicas stop before the peer runs: they would compete for the cores.
        await trio.to_thread.run_sync(stop_replicas)
        if peer is not None:
            await drive_peer(nursery, replicas, effects, leads, sim, peer, results)
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class PeerPlan:
    """The naive peer (bench/effects_peer.py): R processes on one PostgreSQL database."""

    workdir: Path
    concurrency: int
    sim_port: int
    dsn: str = ""
    procs: list[subprocess.Popen[bytes]] = attrs.field(factory=list)

    def create_database(self) -> None:
        import psycopg

        name = f"bench_effects_{secrets.token_hex(4)}"
        with psycopg.connect(PG_DSN + "postgres", autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        self.dsn = PG_DSN + name
        asyncio.run(apply_schema(self.dsn))

    def start(self, replicas: int, intake_ports: list[int],
              runtime_ports: list[int]) -> list[int]:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        runtimes = [{"token": f"bench-runtime-{r}",
                     "results_url": f"http://127.0.0.1:{runtime_ports[r]}/runtime/v1/results",
                     "results_token": f"bench-results-{r}", "contact_base": r * 100000}
                    for r in range(replicas)]
        for r in range(replicas):
            cfg = self.workdir / f"peer-{r}.json"
            cfg.write_text(json.dumps({
                "dsn": self.dsn, "port": intake_ports[r], "concurrency": self.concurrency,
                "provider_url": f"http://127.0.0.1:{self.sim_port}",
                "provider_token": HUBSPOT_TOKEN, "runtimes": runtimes,
            }))
            log = (self.workdir / f"peer-{r}.log").open("wb")
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "bench.effects_peer", str(cfg)],
                stdout=subprocess.DEVNULL, stderr=log, env=env))
        deadline = time.monotonic() + 60
        for r, proc in enumerate(self.procs):
            while True:
                if proc.poll() is not None:
                    log_text = (self.workdir / f"peer-{r}.log").read_text()[-2000:]
                    raise SystemExit(f"peer exited early:\n{log_text}")
                try:
                    with urllib.request.urlopen(
                            f"http://127.0.0.1:{intake_ports[r]}/healthz", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("peer did not start in time") from None
                    time.sleep(0.1)
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()

    def job_failures(self) -> tuple[int, int]:
        """(jobs retried after an error, jobs failed for good) from procrastinate's events."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE type = 'deferred_for_retry'),"
                " count(*) FILTER (WHERE type = 'failed') FROM procrastinate_events"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def drop_database(self) -> None:
        if not self.dsn:
            return
        import psycopg

        with psycopg.connect(PG_DSN + "postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {self.dsn.rsplit('/', 1)[1]} WITH (FORCE)")
        self.dsn = ""


async def drive_peer(nursery: trio.Nursery, replicas: int, effects: int, leads: int,
                     sim: HubSpotSimulator, peer: PeerPlan, results: dict[str, Any]) -> None:
    """The same workload, the same simulator and the same kind of Runtime (fresh ones,
    pointed at the peer's intake), through the naive peer."""
    intake_ports = [free_port() for _ in range(replicas)]
    runtime_ports = [free_port() for _ in range(replicas)]
    runtimes = runtimes_for(replicas, intake_ports)
    await serve_runtimes(nursery, runtimes, runtime_ports, leads)
    await trio.to_thread.run_sync(peer.create_database)
    try:
        pids = await trio.to_thread.run_sync(peer.start, replicas, intake_ports, runtime_ports)
        seen = len(sim.requests)
        cpu_before = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()), postgres_cpu())
        # A job that failed for good (its retries spent) is never committed: give up
        # once nothing was committed for PEER_STALL_S rather than wait out 900 s.
        elapsed = await run_workload(runtimes, effects, leads, stall_s=PEER_STALL_S)
        cpu_after = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()), postgres_cpu())
        total = (effects // replicas) * replicas
        committed = sum(rt.store.stats()["intents_by_status"].get("COMMITTED", 0)
                        for rt in runtimes)
        retried, failed = await trio.to_thread.run_sync(peer.job_failures)
        patches = [r for r in sim.requests[seen:] if r.method == "PATCH"]
        pg = sum(cpu - cpu_before[2].get(pid, 0.0) for pid, cpu in cpu_after[2].items())
        results["peer"] = {
            "system": "procrastinate-httpx (no journal, no fence)",
            "backend": "postgresql",
            "workers": replicas,
            "worker_concurrency": peer.concurrency,
            "effects": total,
            "seconds": round(elapsed, 3),
            "effects_per_s": round(total / elapsed, 1),
            "patch_requests": len(patches),
            "duplicate_patches": sum(1 for p in patches if p.applied) - total,
            # Jobs run again after an error (each PATCHes again), jobs failed for good,
            # and intents the peer never committed (the run gave up on them).
            "job_retries": retried,
            "jobs_failed": failed,
            "not_committed": total - committed,
            "cpu_ms_per_effect": {
                "workers": round(1000 * (sum(cpu_after[0]) - sum(cpu_before[0])) / total, 2),
                "sandbox_runtime_and_simulator": round(
                    1000 * (cpu_after[1] - cpu_before[1]) / total, 2),
                "postgresql": round(1000 * pg / total, 2),
            },
        }
        results["peer_ratio"] = round(
            results["effects_per_s"] / max(results["peer"]["effects_per_s"], 1e-9), 3)
    finally:
        await trio.to_thread.run_sync(peer.stop)
        await trio.to_thread.run_sync(peer.drop_database)


def main() -> None:
    pairs.delegate("bench.effects")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, metavar="N",
                        help="run as N interleaved pairs against --against (bench.pairs)")
    parser.add_argument("--against", metavar="REF", default="HEAD",
                        help="with --pairs: another checkout's directory or a commit")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--effects", type=int, default=5000)
    parser.add_argument("--leads", type=int, default=500, help="Leads per Runtime")
    parser.add_argument("--noop-items", type=int, default=20000,
                        help="kernel benchmark size for the ratio (0: skip)")
    parser.add_argument("--keep", metavar="DIR", help="keep configs and replica logs in DIR")
    parser.add_argument("--peer-concurrency", type=int, default=64,
                        help="procrastinate worker concurrency per peer process")
    parser.add_argument("--no-peer", action="store_true",
                        help="skip the naive procrastinate peer")
    parser.add_argument("--provider-limit", type=int, default=0, metavar="N",
                        help="the provider allows N requests a second, one key shared by"
                        " every replica (0: no quota); reports what it saw of its limit")
    parser.add_argument("--provider-jitter", type=float, default=0.25,
                        help="that dimension's L1 jitter (s): the schedule's ceiling is"
                        " 1 / (1 + jitter) of the limit")
    parser.add_argument("--single-receipts", action="store_true",
                        help="one POST per receipt (no results_batch_url), as a Runtime"
                             " without the batch route is served")
    parser.add_argument("--max-attempts", type=int, default=0,
                        help="external_effect max_attempts (0: the default)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-effects-") as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        url, dbname = fresh_url("mysql", workdir)
        procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            trio.run(seed_links, url, args.replicas, args.leads)
            api_ports = [free_port() for _ in range(args.replicas)]
            runtime_ports = [free_port() for _ in range(args.replicas)]
            sim_port = free_port()
            env = secrets_env(args.replicas)
            os.environ.update(env)
            configs = [write_config(workdir, url, i, args.replicas, api_ports, runtime_ports,
                                    sim_port, provider_limit=args.provider_limit,
                                    provider_jitter_s=args.provider_jitter,
                                    max_attempts=args.max_attempts,
                                    batch_receipts=not args.single_receipts)
                       for i in range(args.replicas)]
            trio.run(publish_catalog, url, configs[0])

            def start_all() -> tuple[list[str], list[int]]:
                procs.extend(start_replica(cfg, i) for i, cfg in enumerate(configs))
                deadline = time.monotonic() + 60
                return [wait_admin(p, log, deadline) for p, log in procs], [p.pid for p, _ in procs]

            rss: list[float] = []

            def stop_all() -> None:
                rss.extend(round(peak_rss_mb(p.pid), 1) for p, _ in procs)
                for p, _ in procs:
                    p.send_signal(signal.SIGTERM)
                for p, _ in procs:
                    p.wait(timeout=60)
                procs.clear()

            sim = HubSpotSimulator(tokens={HUBSPOT_TOKEN})
            results: dict[str, Any] = {"system": "integrationd-effects", "backend": "mysql",
                                       "replicas": args.replicas}
            peer = None if args.no_peer else PeerPlan(workdir, args.peer_concurrency, sim_port)
            trio.run(drive, args.replicas, args.effects, args.leads, api_ports, runtime_ports,
                     sim, sim_port, start_all, stop_all, peer, results, args.provider_limit,
                     url)
            results["peak_rss_mb_per_replica"] = rss
        finally:
            for p, _ in procs:
                p.send_signal(signal.SIGTERM)
            for p, _ in procs:
                p.wait(timeout=60)
            if dbname:
                mysql_admin(f"DROP DATABASE {dbname}")
    print(json.dumps(results), flush=True)
    if args.noop_items:
        noop = bench_integrationd("mysql", args.replicas, args.noop_items, "FULL")
        print(json.dumps(noop), flush=True)
        print(json.dumps({
            "ratio": "effects_per_s / noop_items_per_s (same run, same replicas, MariaDB)",
            "value": round(results["effects_per_s"] / max(noop["items_per_s"], 1e-9), 3),
        }), flush=True)


if __name__ == "__main__":
    main()
