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
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.kernel import (
    bench_integrationd,
    fresh_url,
    mysql_admin,
    peak_rss_mb,
    scrape,
    start_replica,
    wait_admin,
)
from config.catalog import load_catalog
from config.load import load_settings
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.identity import integration_scope_digest
from daemon.services.catalog_view import publish_current
from daemon.services.families import known_family_names
from sandbox.hubspot_sim import HubSpotSimulator
from sandbox.ports import free_port
from sandbox.runtime import ReferenceRuntime
from sandbox.runtime.server import serve as serve_runtime
from storage.migrate import migrate
from storage.open import open_store

HUBSPOT_TOKEN = "bench-hubspot-token"
REVISION = 7


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mariadb_pid() -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "mariadbd":
                    return int(entry.name)
            except OSError:
                continue
    return None


def scope_of(i: int) -> TrustedRuntimeWorkScope:
    return TrustedRuntimeWorkScope(f"org-{i}", f"install-{i}", "cap.leads", f"sha256:bench-{i}")


def write_config(workdir: Path, url: str, i: int, replicas: int, api_ports: list[int],
                 runtime_ports: list[int], sim_port: int) -> Path:
    lines = [
        f'[storage]\nurl = "{url}"\npool_size = 16\n',
        '[admin]\nlisten = "127.0.0.1:0"\n',
        f'[api]\nlisten = "127.0.0.1:{api_ports[i]}"\n',
        "[replica]\ndrain_timeout = 10.0\n",
        f"[catalog]\nrevision = {REVISION}\n",
        "[work]\npoll_interval = 0.1\n",
        "[families.external_effect]\nbatch_size = 64\nconcurrency = 128\n",
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
        )
        lines.append(
            f'[[bindings]]\nbinding_id = "hubspot-{r}"\nprovider = "hubspot"\n'
            f'org_id = "{sc.org_id}"\napp_installation_id = "{sc.app_installation_id}"\n'
            f'remote_account_id = "portal-{r}"\nbase_url = "http://127.0.0.1:{sim_port}"\n'
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


async def drive(replicas: int, effects: int, leads: int, api_ports: list[int],
                runtime_ports: list[int], sim: HubSpotSimulator, sim_port: int,
                start_replicas: Any, results: dict[str, Any]) -> None:
    runtimes = [
        ReferenceRuntime(
            scope=scope_of(r), integration_url=f"http://127.0.0.1:{api_ports[r]}",
            integration_token=f"bench-runtime-{r}", results_token=f"bench-results-{r}",
            catalog_revision=REVISION, poll_interval_s=0.05, dispatch_concurrency=32,
        )
        for r in range(replicas)
    ]
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, "127.0.0.1", sim_port)
        for r, rt in enumerate(runtimes):
            await nursery.start(serve_runtime, rt, "127.0.0.1", runtime_ports[r])
            for i in range(leads):
                sim.add_contact(f"{r * 100000 + i}", jobtitle="Engineer")
                rt.store.create_lead({"lead_id": f"lead-{i}", "title": "Engineer"})
        admins, pids = await trio.to_thread.run_sync(start_replicas)
        before = [await trio.to_thread.run_sync(scrape, a) for a in admins]
        db_pid = mariadb_pid()
        cpu_before = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()),
                      cpu_seconds(db_pid) if db_pid else 0.0)
        per_runtime = effects // replicas
        t0 = time.monotonic()
        for rt in runtimes:
            for n in range(per_runtime):
                rt.store.update_lead(f"lead-{n % leads}", {"title": f"Title {n}"})
            rt.wakeup.set()
        total = per_runtime * replicas
        with trio.fail_after(900):
            while True:
                done = sum(rt.store.stats()["intents_by_status"].get("COMMITTED", 0)
                           for rt in runtimes)
                if done >= total:
                    break
                await trio.sleep(0.05)
        elapsed = time.monotonic() - t0
        cpu_after = ([cpu_seconds(p) for p in pids], cpu_seconds(os.getpid()),
                     cpu_seconds(db_pid) if db_pid else 0.0)
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
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--effects", type=int, default=5000)
    parser.add_argument("--leads", type=int, default=500, help="Leads per Runtime")
    parser.add_argument("--noop-items", type=int, default=20000,
                        help="kernel benchmark size for the ratio (0: skip)")
    parser.add_argument("--keep", metavar="DIR", help="keep configs and replica logs in DIR")
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
                                    sim_port) for i in range(args.replicas)]
            trio.run(publish_catalog, url, configs[0])

            def start_all() -> tuple[list[str], list[int]]:
                procs.extend(start_replica(cfg, i) for i, cfg in enumerate(configs))
                deadline = time.monotonic() + 60
                return [wait_admin(p, log, deadline) for p, log in procs], [p.pid for p, _ in procs]

            sim = HubSpotSimulator(tokens={HUBSPOT_TOKEN})
            results: dict[str, Any] = {"system": "integrationd-effects", "backend": "mysql",
                                       "replicas": args.replicas}
            trio.run(drive, args.replicas, args.effects, args.leads, api_ports, runtime_ports,
                     sim, sim_port, start_all, results)
            results["peak_rss_mb_per_replica"] = [round(peak_rss_mb(p.pid), 1) for p, _ in procs]
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
