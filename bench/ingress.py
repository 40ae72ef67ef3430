"""Webhook ingress benchmark: signed deliveries driven open-loop at fixed rates.

    python -m bench.ingress [--backends sqlite,mysql] [--rates 100,250,500,1000]
                            [--duration 10] [--spool-rate 250]

For each backend, one ``integrationd run`` process (its ingress listener, materializer and
work schedulers all running, ``sqlite_synchronous = FULL`` on SQLite) receives signed
Outreach-shaped deliveries (every body distinct, so each is a new receipt) at each fixed
rate for ``--duration`` seconds; then the peer (``bench/ingress_peer.py``: Starlette on
uvicorn, the same HMAC check and one INSERT per delivery with a synchronous driver in a
thread) receives the same load. Open loop: request *i* is due at ``t0 + i / rate`` and its
latency is measured from then, so a server that falls behind shows its queue (no
coordinated omission); requests go over up to 128 keep-alive connections.

Then the spool path: integrationd with its database away (MariaDB behind a TCP proxy that
refuses connections; SQLite held by another process's exclusive write transaction, so each
receipt waits ``ingress.db_deadline`` before it goes to the spool), at ``--spool-rate``.

Output: one JSON line per system, backend and rate (``system``, ``backend``, ``rate``,
``requests``, ``p50_ms``, ``p99_ms``, ``p999_ms``, ``max_ms``, ``errors``), a line per
spool run (``mode: "spool"``), and a summary line per system and backend with
``max_rate_p99_under_250ms``, and the ratio to the peer.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench import pairs
from bench.kernel import REPO, fresh_url, mysql_admin
from config.catalog import load_catalog
from config.load import load_settings
from daemon.services.catalog_view import publish_current
from daemon.services.families import known_family_names
from sandbox.ports import free_port
from storage.migrate import migrate
from storage.open import open_store

SECRET = "bench-webhook-secret"
ROUTE = "outreach-main"
CONNECTIONS = 128
PEER = "starlette-uvicorn"


# ------------------------------------------------------------------ load


def _request(port: int, n: int, tag: str) -> bytes:
    body = json.dumps({
        "data": {"type": "prospect", "id": n, "attributes": {
            "title": f"title {tag} {n}", "updatedAt": "2026-12-01T10:00:00.000Z"}},
        "meta": {"eventName": "prospect.updated", "deliveredAt": f"{tag}-{n}"},
    }).encode()
    signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    head = (f"POST /hooks/{ROUTE} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/vnd.api+json\r\nContent-Length: {len(body)}\r\n"
            f"Outreach-Webhook-Signature: {signature}\r\n"
            f"Outreach-Webhook-ID: {tag}-{n}\r\n\r\n").encode()
    return head + body


async def _read_response(stream: trio.SocketStream, buffer: bytearray) -> int:
    while b"\r\n\r\n" not in buffer:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("closed")
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            raise ConnectionError("closed")
        rest += chunk
    buffer[:] = rest[length:]
    return status


async def drive(port: int, rate: int, duration_s: float, tag: str) -> dict[str, Any]:
    """Open-loop: ``rate`` requests per second for ``duration_s``; latencies from due time."""
    total = int(rate * duration_s)
    requests = [_request(port, n, tag) for n in range(total)]
    latencies: list[float] = []
    errors = 0
    send, receive = trio.open_memory_channel[tuple[float, bytes]](math.inf)

    async def worker() -> None:
        nonlocal errors
        stream: trio.SocketStream | None = None
        buffer = bytearray()
        async with receive.clone() as jobs:
            async for due, raw in jobs:
                try:
                    if stream is None:
                        stream = await trio.open_tcp_stream("127.0.0.1", port)
                        buffer = bytearray()
                    with trio.fail_after(10):
                        await stream.send_all(raw)
                        status = await _read_response(stream, buffer)
                    if status != 200:
                        errors += 1
                except (OSError, ConnectionError, trio.BrokenResourceError, trio.TooSlowError,
                        ValueError, IndexError):
                    errors += 1
                    if stream is not None:
                        await stream.aclose()
                    stream = None
                latencies.append(time.perf_counter() - due)
        if stream is not None:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(CONNECTIONS):
            nursery.start_soon(worker)
        async with send:
            start = time.perf_counter() + 0.05
            for i, raw in enumerate(requests):
                due = start + i / rate
                await trio.sleep(max(0.0, due - time.perf_counter()))
                send.send_nowait((due, raw))
        receive.close()
    latencies.sort()

    def pct(p: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000, 2)

    return {"rate": rate, "requests": total, "p50_ms": pct(0.50), "p99_ms": pct(0.99),
            "p999_ms": pct(0.999), "max_ms": round(latencies[-1] * 1000, 2),
            "errors": errors}


# ------------------------------------------------------------------ systems


def _config(workdir: Path, url: str, ingress_port: int) -> Path:
    cfg = workdir / "bench.toml"
    cfg.write_text(f"""
[storage]
url = "{url}"
sqlite_synchronous = "FULL"

[admin]
listen = "127.0.0.1:0"

[replica]
drain_timeout = 5.0

[ingress]
listen = "127.0.0.1:{ingress_port}"
spool_dir = "{workdir / 'spool'}"
spool_max_bytes = 1073741824

[[bindings]]
binding_id = "outreach-main"
provider = "outreach"
org_id = "org-bench"
app_installation_id = "inst-bench"
remote_account_id = "acct-bench"
base_url = "http://127.0.0.1:1"

[[webhook_routes]]
route = "{ROUTE}"
binding_id = "outreach-main"
webhook = "outreach.prospect_events"
""")
    return cfg


async def _prepare(cfg: Path, url: str) -> None:
    settings = load_settings(str(cfg), environ={}, known_families=known_family_names())
    store = await open_store(url, base_dir=str(cfg.parent))
    try:
        await migrate(store.db, store.dialect, time.time_ns() // 1000)
        await publish_current(store, load_catalog(settings), actor="bench", role="admin",
                              reason="bench", now_us=time.time_ns() // 1000)
    finally:
        await store.db.aclose()


def _start(command: list[str], workdir: Path, name: str,
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = (workdir / f"{name}.log").open("wb")
    return subprocess.Popen([sys.executable, *command], stdout=subprocess.DEVNULL,
                            stderr=log, cwd=workdir,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


async def _wait_port(port: int, proc: subprocess.Popen[bytes], within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early ({proc.returncode})")
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.aclose()
            return
        except OSError:
            await trio.sleep(0.1)
    raise SystemExit("server did not listen in time")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _integrationd(backend: str, url: str, workdir: Path, rates: list[int],
                        duration: float) -> list[dict[str, Any]]:
    port = free_port()
    cfg = _config(workdir, url, port)
    await _prepare(cfg, url)
    profile = os.environ.get("BENCH_PROFILE_DIR")  # profile the replica with cProfile
    command = (["-m", "bench.profile_replica", f"{profile}/ingress-{backend}.prof"]
               if profile else ["-m", "daemon.cli"])
    proc = _start([*command, "--config", str(cfg), "run"], workdir, "integrationd",
                  {"INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET": SECRET})
    try:
        await _wait_port(port, proc)
        await trio.sleep(2)  # the replica's start-up (database, schema, identity)
        out = []
        for rate in rates:
            out.append({"system": "integrationd", "backend": backend,
                        **await drive(port, rate, duration, f"i{rate}")})
            print(json.dumps(out[-1]), flush=True)
            await trio.sleep(1)
        return out
    finally:
        _stop(proc)


async def _peer(backend: str, url: str, workdir: Path, rates: list[int],
                duration: float) -> list[dict[str, Any]]:
    port = free_port()
    dsn = str(workdir / "peer.db") if backend == "sqlite" else url
    conf = workdir / "peer.json"
    conf.write_text(json.dumps({"backend": backend, "dsn": dsn, "port": port,
                                "secret": SECRET}))
    proc = _start(["-m", "bench.ingress_peer", str(conf)], workdir, "peer")
    try:
        await _wait_port(port, proc)
        out = []
        for rate in rates:
            out.append({"system": PEER, "backend": backend,
                        **await drive(port, rate, duration, f"p{rate}")})
            print(json.dumps(out[-1]), flush=True)
            await trio.sleep(1)
        return out
    finally:
        _stop(proc)


async def _spool(backend: str, url: str, workdir: Path, rate: int,
                 duration: float) -> dict[str, Any]:
    """integrationd with its database away: every receipt goes to the local spool."""
    port = free_port()
    if backend == "mysql":
        from storage.mysql.adapter import MysqlTarget
        from tests.support.chaos_proxy import ChaosProxy

        target = MysqlTarget.from_url(url)
        proxy = ChaosProxy(target.host, target.port)
        async with trio.open_nursery() as nursery:
            proxy_port = await nursery.start(proxy.run)
            proxied = url.replace(f"@{target.host}:{target.port}/",
                                  f"@127.0.0.1:{proxy_port}/")
            result = await _spool_run(backend, proxied, workdir, port, rate, duration,
                                      away=proxy.refuse)
            nursery.cancel_scope.cancel()
        return result
    holder: list[sqlite3.Connection] = []

    def lock() -> None:
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        holder.append(conn)

    try:
        return await _spool_run(backend, url, workdir, port, rate, duration, away=lock)
    finally:
        for conn in holder:
            conn.execute("ROLLBACK")
            conn.close()


async def _spool_run(backend: str, url: str, workdir: Path, port: int, rate: int,
                     duration: float, *, away: Any) -> dict[str, Any]:
    cfg = _config(workdir, url, port)
    cfg.write_text(cfg.read_text().replace('spool_dir = "', 'spool_dir = "spool-path-'))
    await _prepare(cfg, url)
    proc = _start(["-m", "daemon.cli", "--config", str(cfg), "run"], workdir, "spool",
                  {"INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET": SECRET})
    try:
        await _wait_port(port, proc)
        await trio.sleep(2)
        away()
        result = await drive(port, rate, duration, f"s{rate}")
        return {"system": "integrationd", "backend": backend, "mode": "spool", **result}
    finally:
        _stop(proc)


def _summary(rows: list[dict[str, Any]], system: str, backend: str) -> dict[str, Any]:
    ok = [r["rate"] for r in rows if r["system"] == system and r["backend"] == backend
          and r["p99_ms"] < 250 and r["errors"] == 0]
    return {"summary": True, "system": system, "backend": backend,
            "max_rate_p99_under_250ms": max(ok, default=0)}


async def run(backends: list[str], rates: list[int], duration: float,
              spool_rate: int) -> None:
    for backend in backends:
        with tempfile.TemporaryDirectory(prefix=f"bench-ingress-{backend}-") as tmp:
            workdir = Path(tmp)
            url, database = fresh_url(backend, workdir)
            peer_url, peer_db = fresh_url(backend, workdir) if backend == "mysql" else (url,
                                                                                       None)
            spool_url, spool_db = fresh_url(backend, workdir) if backend == "mysql" else (
                f"sqlite:///{workdir / 'spool.db'}", None)
            try:
                rows = await _integrationd(backend, url, workdir, rates, duration)
                rows += await _peer(backend, peer_url, workdir, rates, duration)
                spooled = await _spool(backend, spool_url, workdir, spool_rate, duration)
                print(json.dumps(spooled), flush=True)
                ours = _summary(rows, "integrationd", backend)
                theirs = _summary(rows, PEER, backend)
                print(json.dumps(ours), flush=True)
                print(json.dumps(theirs), flush=True)
                print(json.dumps({
                    "backend": backend,
                    "ratio_max_rate": round(ours["max_rate_p99_under_250ms"]
                                            / max(1, theirs["max_rate_p99_under_250ms"]), 2),
                }), flush=True)
            finally:
                for name in (database, peer_db, spool_db):
                    if name:
                        mysql_admin(f"DROP DATABASE IF EXISTS {name}")


def main() -> None:
    pairs.delegate("bench.ingress")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, metavar="N",
                        help="run as N interleaved pairs against --against (bench.pairs)")
    parser.add_argument("--against", metavar="REF", default="HEAD",
                        help="with --pairs: another checkout's directory or a commit")
    parser.add_argument("--backends", default="sqlite,mysql")
    parser.add_argument("--rates", default="100,250,500,1000")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--spool-rate", type=int, default=250)
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in ("sqlite", "mysql"):
            parser.error(f"unknown backend {b!r}")
    trio.run(run, backends, [int(r) for r in args.rates.split(",")], args.duration,
             args.spool_rate)


if __name__ == "__main__":
    main()
