"""Kernel benchmark: N ``noop`` items drained by R replica processes, against a peer.

    python -m bench.kernel --backend mysql --replicas 4 --items 20000

What it does, on either backend:

1. a fresh database; N ``noop`` items enqueued with ``run_after`` far in the
   future, so that replica start-up is not timed;
2. R ``integrationd run`` processes started and ready;
3. one UPDATE makes every item ready; the drain is timed from the moment it has
   committed (the items claimable) to the last execution's ``finished_at`` (from the
   execution journal). The UPDATE itself (``release_s``) is not the system's work: at 8
   replicas it took up to three times as long as at 2 (idle polls walking the
   half-updated range build an old version of each row it had updated;
   docs/performance.md, "Claims across replicas"), and it used to count as drain time;
4. statements and commits come from each replica's ``/metrics`` and CPU from ``/proc``
   (differences from just before the release to the end of the drain: start-up is
   excluded, the polls during the release are counted); resident memory
   (peak) from ``/proc``; duplicates and lost items from the execution journal,
   which holds every execution (an execution whose lease was reclaimed is there as
   ``lease_lost``): ``duplicates`` counts executions beyond the first of each item,
   whatever their outcome, not repeated finalizations.

Then the same N no-op jobs go through procrastinate on the local PostgreSQL,
with R worker processes, released the same way, and the ratio is printed.
Output: one JSON line per system, then one JSON line with the ratio.

``--backend galera`` (issue 12) instead runs the same drain twice in one run: on the
MariaDB server, then on a 3-node Galera cluster started for the run
(:mod:`sandbox.galera`), replica *i* connected to node *i mod 3*, so that claim races
cross nodes and the losers fail certification at COMMIT; a conflict is retried per
transaction (``transaction_retries``, per item in ``retries_per_item``). It prints both
lines and the ratio galera / mariadb.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import trio

from bench import pairs
from daemon.core.states import TERMINAL, WorkState
from daemon.core.work import WorkSpec
from sandbox.galera import GaleraCluster
from storage.migrate import migrate
from storage.open import open_store
from storage.port import ExecutionSummary, SqlTx

REPO = Path(__file__).resolve().parents[1]
MYSQL_URL = os.environ.get("INTEGRATIOND_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
PG_DSN = os.environ.get("INTEGRATIOND_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/")
FAR_FUTURE_US = 4_000_000_000_000_000


def now_us() -> int:
    return time.time_ns() // 1000


# ------------------------------------------------------------------ databases


def _mariadb_cli() -> list[str]:
    """The ``mariadb`` client's command line for the benchmark server."""
    from storage.mysql.adapter import MysqlTarget

    target = MysqlTarget.from_url(MYSQL_URL)
    return ["mariadb", f"--host={target.host}", f"--port={target.port}",
            f"--user={target.user}"]


def mysql_admin(sql: str) -> None:
    subprocess.run([*_mariadb_cli(), "-e", sql], check=True)


def mysql_query(sql: str) -> list[str]:
    """One row of the benchmark server's answer, as text."""
    out = subprocess.run([*_mariadb_cli(), "-N", "-B", "-e", sql], check=True,
                         capture_output=True, text=True)
    return out.stdout.rstrip("\n").split("\t")


def fresh_url(backend: str, workdir: Path) -> tuple[str, str | None]:
    if backend == "sqlite":
        return f"sqlite:///{workdir / 'bench.db'}", None
    from storage.mysql.adapter import MysqlTarget

    name = f"bench_{secrets.token_hex(4)}"
    mysql_admin(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    base = MysqlTarget.from_url(MYSQL_URL)
    return f"mysql://{base.user}@{base.host}:{base.port}/{name}", name


async def prepare(url: str, items: int, sqlite_synchronous: str) -> None:
    store = await open_store(url, sqlite_synchronous=sqlite_synchronous)
    await migrate(store.db, store.dialect, now_us())
    done = 0
    while done < items:
        n = min(2000, items - done)
        specs = [
            WorkSpec(family="noop", org_id="org-bench", subject_kind="bench",
                     subject_id=f"b{done + i}", run_after_us=FAR_FUTURE_US)
            for i in range(n)
        ]
        await store.work_enqueue(specs, now_us())
        done += n
    await store.db.aclose()


async def release(url: str) -> tuple[int, int]:
    """(when the release began, when it had committed): the items' ``run_after`` is the
    first; the drain starts at the second."""
    store = await open_store(url, sqlite_synchronous="NORMAL")
    t0 = now_us()

    async def body(tx: SqlTx) -> None:
        # Only the run's own items (a big database holds other families' pending work).
        await tx.execute("UPDATE work_items SET run_after_us = ? WHERE state = 'pending'"
                         " AND family = 'noop' AND run_after_us = ?", (t0, FAR_FUTURE_US))

    await store.db.transact(body, name="bench.release")
    committed = now_us()
    await store.db.aclose()
    return t0, committed


# One probe per open state: the first row's index entry, not a count.
_OPEN_PROBE = "SELECT 1 FROM work_items WHERE state = ? AND family = 'noop' LIMIT 1"
_OPEN_STATES = sorted(s.value for s in frozenset(WorkState) - TERMINAL)


async def wait_drained(url: str, within_s: float, poll_s: float = 0.2) -> None:
    """Until no noop item is open, or ``within_s`` has passed.

    The wait runs beside the drain it measures, on the same server, so it must cost next
    to nothing there: one connection for the whole wait, and per poll an existence probe
    per open state. It used to open a store per poll and COUNT every open row. Under
    concurrent claims a count reads old row versions for each row: at 8 replicas it read
    124,000 pages a poll against 3,900 at 2, a quarter of the server's page reads of the
    run, which the run charged to the replicas (docs/performance.md, "Claims across
    replicas")."""
    store = await open_store(url, sqlite_synchronous="NORMAL")

    async def anything_open(tx: SqlTx) -> bool:
        for state in _OPEN_STATES:
            if await tx.fetchall(_OPEN_PROBE, (state,)):
                return True
        return False

    try:
        with trio.move_on_after(within_s):
            while True:
                if not await store.db.transact(anything_open, name="bench.open", write=False):
                    return
                await trio.sleep(poll_s)
    finally:
        await store.db.aclose()


async def journal(url: str, since_us: int = 0) -> tuple[ExecutionSummary, int]:
    """(every noop execution in the journal since ``since_us``, last finished_at_us).

    A run on a database that already holds a year of executions (``bench.bigtables``)
    counts only its own: those finished after it released its items (an index range)."""
    store = await open_store(url, sqlite_synchronous="NORMAL")
    try:
        if since_us:
            summary = await _summary_since(store, since_us)
        else:
            summary = await store.work_execution_summary("noop")

        async def body(tx: SqlTx) -> int:
            (row,) = await tx.fetchall("SELECT MAX(finished_at_us) FROM work_executions")
            return int(row[0] or 0)

        last = await store.db.transact(body, name="bench.last", write=False)
        return summary, last
    finally:
        await store.db.aclose()


async def _summary_since(store: Any, since_us: int) -> ExecutionSummary:
    async def body(tx: SqlTx) -> ExecutionSummary:
        rows = await tx.fetchall(
            "SELECT work_id, outcome FROM work_executions WHERE finished_at_us >= ?"
            " AND family = 'noop'", (since_us,))
        by_outcome: dict[str, int] = {}
        for _, outcome in rows:
            by_outcome[str(outcome)] = by_outcome.get(str(outcome), 0) + 1
        succeeded = {str(w) for w, o in rows if o == "succeeded"}
        return ExecutionSummary(executions=len(rows), items=len({str(w) for w, _ in rows}),
                                succeeded_items=len(succeeded), by_outcome=by_outcome)

    result: ExecutionSummary = await store.db.transact(body, name="bench.since", write=False)
    return result


# ------------------------------------------------------------------ replicas


def galera_database(cluster: GaleraCluster) -> tuple[list[str], str]:
    """A fresh database on the cluster: one URL per node."""
    name = f"bench_{secrets.token_hex(4)}"
    cluster.sql(cluster.nodes[0], f"CREATE DATABASE {name} CHARACTER SET utf8mb4"
                                  " COLLATE utf8mb4_bin")
    for node in cluster.nodes[1:]:  # a causal read there waits until the node has it
        cluster.sql(node, "SELECT 1")
    return [node.url(name) for node in cluster.nodes], name


def write_config(workdir: Path, url: str, sqlite_synchronous: str, name: str = "bench",
                 pool_size: int | None = None) -> Path:
    cfg = workdir / f"{name}.toml"
    cfg.write_text(
        f'[storage]\nurl = "{url}"\nsqlite_synchronous = "{sqlite_synchronous}"\n'
        + (f"pool_size = {pool_size}\n" if pool_size is not None else "")
        + '[admin]\nlisten = "127.0.0.1:0"\n'
        "[replica]\ndrain_timeout = 10.0\n"
        # No pruning during a measurement (bench.bigtables runs on a year of history).
        "[retention]\nenabled = false\n"
    )
    return cfg


def start_replica(cfg: Path, index: int) -> tuple[subprocess.Popen[bytes], Path]:
    log = cfg.parent / f"replica-{index}.log"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    profile = os.environ.get("BENCH_PROFILE_DIR")  # profile replica 0 with cProfile
    # Count replica 0's statements by transaction and text (bench.sql_tally).
    tally = os.environ.get("BENCH_SQL_TALLY_DIR")
    command = (["-m", "bench.profile_replica", f"{profile}/replica-{index}.prof"]
               if profile and index == 0 else
               ["-m", "bench.sql_tally", f"{tally}/replica-{index}.json"]
               if tally and index == 0 else ["-m", "daemon.cli"])
    with log.open("wb") as stderr:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, *command, "--config", str(cfg), "run"],
            stdout=subprocess.DEVNULL, stderr=stderr, cwd=cfg.parent, env=env,
        )
    return proc, log


def snapshot_tally(proc: subprocess.Popen[bytes]) -> None:
    """With ``BENCH_SQL_TALLY_DIR``: replica 0 (bench.sql_tally) keeps a copy of its counts
    so far, so that the drain's own transactions are the difference of two copies."""
    if os.environ.get("BENCH_SQL_TALLY_DIR"):
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)  # taken before what follows begins


def wait_admin(proc: subprocess.Popen[bytes], log: Path, deadline: float) -> str:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"replica exited early:\n{log.read_text()[-2000:]}")
        for line in log.read_text(errors="replace").splitlines():
            if '"replica_started"' in line:
                return str(json.loads(line)["admin"])
        time.sleep(0.05)
    raise SystemExit("replica did not start in time")


def scrape(admin: str) -> dict[str, float]:
    with urllib.request.urlopen(admin + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for name in ("integrationd_db_statements_total", "integrationd_db_commits_total",
                 "integrationd_work_claimed_total", "integrationd_db_transaction_retries_total",
                 "integrationd_work_claim_contention_total"):
        total = 0.0
        for match in re.finditer(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.MULTILINE):
            total += float(match.group(1))
        out[name] = total
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (from /proc; 0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def mariadb_pid() -> int | None:
    """The MariaDB server the benchmark uses: the oldest ``mariadbd`` that is not a test
    suite's Galera node (a server started with ``--wsrep-on``; those come and go, and one of
    them was taken for it, its CPU reported as MariaDB's or the run failing when it exited)."""
    found: list[tuple[int, int]] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "mariadbd" \
                        and b"--wsrep-on" not in (entry / "cmdline").read_bytes():
                    started = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[19])
                    found.append((started, int(entry.name)))
            except (OSError, ValueError, IndexError):
                continue
    return min(found)[1] if found else None


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_integrationd(backend: str, replicas: int, items: int,
                       sqlite_synchronous: str, cluster: GaleraCluster | None = None,
                       url: str | None = None, pool_size: int | None = None
                       ) -> dict[str, Any]:
    """``url``: run on that existing database (its other rows stay; it is not dropped).
    ``pool_size``: each replica's ``storage.pool_size`` (None: the default)."""
    with tempfile.TemporaryDirectory(prefix="bench-kernel-") as tmp:
        workdir = Path(tmp)
        dbname: str | None
        if url:
            urls, dbname = [url], None
        elif cluster is not None:
            urls, dbname = galera_database(cluster)
        else:
            one, dbname = fresh_url(backend, workdir)
            urls = [one]
        url = urls[0]
        try:
            trio.run(prepare, url, items, sqlite_synchronous)
            cfgs = [write_config(workdir, u, sqlite_synchronous, f"bench-{n}", pool_size)
                    for n, u in enumerate(urls)]
            procs = [start_replica(cfgs[i % len(cfgs)], i) for i in range(replicas)]
            try:
                # Generous: replicas start slowly on a loaded machine (load 30 here).
                deadline = time.monotonic() + 240
                admins = [wait_admin(p, log, deadline) for p, log in procs]
                before = [scrape(a) for a in admins]
                server = mariadb_pid() if backend == "mysql" else None
                cpu_before = ([cpu_seconds(p.pid) for p, _ in procs],
                              cpu_seconds(server) if server else 0.0)
                snapshot_tally(procs[0][0])
                t0, committed = trio.run(release, url)
                trio.run(wait_drained, url, 600.0)
                snapshot_tally(procs[0][0])
                cpu_after = ([cpu_seconds(p.pid) for p, _ in procs],
                             cpu_seconds(server) if server else 0.0)
                after = [scrape(a) for a in admins]
                rss = [peak_rss_mb(p.pid) for p, _ in procs]
            finally:
                for p, _ in procs:
                    p.send_signal(signal.SIGTERM)
                for p, _ in procs:
                    p.wait(timeout=60)
            summary, last = trio.run(journal, url, t0 if dbname is None and backend == "mysql"
                                     else 0)
        finally:
            if dbname and cluster is not None:
                cluster.sql(cluster.nodes[0], f"DROP DATABASE {dbname}")
            elif dbname:
                mysql_admin(f"DROP DATABASE {dbname}")

    def delta(name: str) -> float:
        return sum(a[name] - b[name] for a, b in zip(after, before, strict=True))

    seconds = max(1e-9, (last - committed) / 1_000_000)
    return {
        "system": "integrationd",
        "backend": backend,
        "replicas": replicas,
        "items": items,
        "seconds": round(seconds, 3),
        "items_per_s": round(summary.succeeded_items / seconds, 1),
        "release_s": round((committed - t0) / 1_000_000, 3),
        "statements_per_item": round(delta("integrationd_db_statements_total") / items, 3),
        "commits_per_item": round(delta("integrationd_db_commits_total") / items, 4),
        "transaction_retries": int(delta("integrationd_db_transaction_retries_total")),
        "retries_per_item": round(delta("integrationd_db_transaction_retries_total") / items,
                                  4),
        "claim_contention": int(delta("integrationd_work_claim_contention_total")),
        # Lost claim races (candidates another replica took first) per item.
        "claim_contention_per_item": round(
            delta("integrationd_work_claim_contention_total") / items, 3),
        # CPU per 1,000 items during the drain (to the end of the wait: a few 0.2 s
        # polls past the last item): the replicas together, and the database server's.
        "replica_cpu_s_per_1000": round(
            (sum(cpu_after[0]) - sum(cpu_before[0])) * 1000 / items, 3),
        **({"server_cpu_s_per_1000": round((cpu_after[1] - cpu_before[1]) * 1000 / items, 3)}
           if backend == "mysql" else {}),
        "executions": summary.executions,
        "duplicates": summary.repeated,
        "lease_lost": summary.by_outcome.get("lease_lost", 0),
        "lost": items - summary.succeeded_items,
        "peak_rss_mb_per_replica": [round(r, 1) for r in rss],
        **({"sqlite_synchronous": sqlite_synchronous} if backend == "sqlite" else {}),
        **({"nodes": len(urls)} if cluster is not None else {}),
        **({"pool_size": pool_size} if pool_size is not None else {}),
    }


def bench_galera(replicas: int, items: int) -> None:
    """MariaDB, then Galera with replicas spread over its nodes, and their ratio."""
    mariadb = bench_integrationd("mysql", replicas, items, "NORMAL")
    print(json.dumps(mariadb), flush=True)
    cluster = GaleraCluster.create()
    try:
        cluster.start()
        galera = bench_integrationd("galera", replicas, items, "NORMAL", cluster)
    finally:
        cluster.stop()
    print(json.dumps(galera), flush=True)
    print(json.dumps({
        "ratio": "galera_items_per_s / mariadb_items_per_s",
        "value": round(galera["items_per_s"] / max(mariadb["items_per_s"], 1e-9), 2),
    }), flush=True)


# ------------------------------------------------------------------ the peer


def bench_procrastinate(workers: int, items: int, concurrency: int) -> dict[str, Any]:
    import psycopg

    name = f"bench_proc_{secrets.token_hex(4)}"
    with psycopg.connect(PG_DSN + "postgres", autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    dsn = PG_DSN + name
    try:
        from bench.procrastinate_peer import make_app

        app = make_app(dsn)

        async def setup() -> None:
            import datetime

            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                task = app.tasks["noop"].configure(
                    schedule_at=datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC))
                done = 0
                while done < items:
                    n = min(2000, items - done)
                    await task.batch_defer_async(*({} for _ in range(n)))
                    done += n

        import asyncio

        asyncio.run(setup())
        env = dict(os.environ, PYTHONPATH=str(REPO))
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.procrastinate_peer", "worker", dsn,
                 str(concurrency)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            )
            for _ in range(workers)
        ]
        try:
            time.sleep(3.0)  # let every worker start and connect
            with psycopg.connect(dsn, autocommit=True) as conn:
                started = conn.execute(
                    "UPDATE procrastinate_jobs SET scheduled_at = now() RETURNING now()"
                ).fetchone()[0]  # type: ignore[index]
                # Timed, as ours, from the release's commit (autocommit: it has).
                t0 = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
                limit = time.monotonic() + 900
                while time.monotonic() < limit:
                    left = conn.execute(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
                    ).fetchone()[0]  # type: ignore[index]
                    if not left:
                        break
                    time.sleep(0.2)
                last, done = conn.execute(
                    "SELECT max(at), count(*) FROM procrastinate_events WHERE type = 'succeeded'"
                ).fetchone()  # type: ignore[misc]
                rss = [peak_rss_mb(p.pid) for p in procs]
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                p.wait(timeout=60)
    finally:
        with psycopg.connect(PG_DSN + "postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    seconds = max(1e-9, (last - t0).total_seconds())
    return {
        "system": "procrastinate",
        "backend": "postgresql",
        "workers": workers,
        "worker_concurrency": concurrency,
        "items": items,
        "seconds": round(seconds, 3),
        "items_per_s": round(done / seconds, 1),
        "release_s": round((t0 - started).total_seconds(), 3),
        "lost": items - done,
        "peak_rss_mb_per_worker": [round(r, 1) for r in rss],
    }


def main() -> None:
    pairs.delegate("bench.kernel")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, metavar="N",
                        help="run as N interleaved pairs against --against (bench.pairs)")
    parser.add_argument("--against", metavar="REF", default="HEAD",
                        help="with --pairs: another checkout's directory or a commit")
    parser.add_argument("--backend", choices=["mysql", "sqlite", "galera"], default="mysql",
                        help="galera: MariaDB and a 3-node Galera cluster in one run")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--items", type=int, default=20000)
    parser.add_argument("--sqlite-synchronous", default="FULL",
                        choices=["NORMAL", "FULL"])
    parser.add_argument("--peer-concurrency", type=int, default=16,
                        help="procrastinate worker concurrency (per process)")
    parser.add_argument("--no-peer", action="store_true", help="skip procrastinate")
    parser.add_argument("--pool-size", type=int,
                        help="each replica's storage.pool_size (default: the daemon's)")
    args = parser.parse_args()
    if args.pool_size is not None and args.pool_size < 1:
        parser.error(f"--pool-size: connections per replica, 1 or more (got {args.pool_size})")
    if args.backend == "galera":
        bench_galera(args.replicas, args.items)
        return
    ours = bench_integrationd(args.backend, args.replicas, args.items, args.sqlite_synchronous,
                              pool_size=args.pool_size)
    print(json.dumps(ours), flush=True)
    if args.no_peer:
        return
    peer = bench_procrastinate(args.replicas, args.items, args.peer_concurrency)
    print(json.dumps(peer), flush=True)
    print(json.dumps({
        "ratio": "integrationd_items_per_s / procrastinate_items_per_s",
        "backend": args.backend,
        "value": round(ours["items_per_s"] / max(peer["items_per_s"], 1e-9), 2),
    }), flush=True)


if __name__ == "__main__":
    main()
