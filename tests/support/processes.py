"""Real ``integrationd`` OS processes for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import attrs
import trio

REPO = Path(__file__).resolve().parents[2]


def write_config(path: Path, url: str, *, extra: str = "", lease_ttl: float = 30.0,
                 lease_margin: float = 2.0, drain_timeout: float = 30.0,
                 batch_size: int = 64, concurrency: int = 128, storage_extra: str = "",
                 replica_extra: str = "", admin_listen: str = "127.0.0.1:0",
                 heartbeat_interval: float = 1.0) -> Path:
    path.write_text(
        f"""
[storage]
url = "{url}"
sqlite_synchronous = "NORMAL"
{storage_extra}

[replica]
drain_timeout = {drain_timeout}
heartbeat_interval = {heartbeat_interval}
{replica_extra}

[admin]
listen = "{admin_listen}"

[work]
poll_interval = 0.1
reclaim_interval = 0.5
depth_sample_interval = 1.0
lease_margin = {lease_margin}

[families.noop]
lease_ttl = {lease_ttl}
batch_size = {batch_size}
concurrency = {concurrency}
max_attempts = 5

[[operators]]
name = "alice"
role = "operator"

[[operators]]
name = "victor"
role = "viewer"
{extra}
"""
    )
    return path


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.pop("NOTIFY_SOCKET", None)
    return env


def run_cli(config: Path, *args: str, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run one ``integrationd`` command to completion."""
    return subprocess.run(
        [sys.executable, "-m", "daemon.cli", "--config", str(config), *args],
        capture_output=True, text=True, cwd=cwd or config.parent, env=env or cli_env(),
        timeout=120, check=False,
    )


@attrs.define(eq=False)
class ReplicaProcess:
    proc: trio.Process
    log: Path
    admin: str = ""

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    async def wait_event(self, name: str, within_s: float = 30.0) -> dict[str, Any]:
        with trio.fail_after(within_s):
            while True:
                for ev in self.events():
                    if ev.get("event") == name:
                        return ev
                if self.proc.returncode is not None:
                    raise AssertionError(
                        f"replica exited ({self.proc.returncode}) before {name}:\n"
                        + self.log.read_text(errors="replace")[-3000:]
                    )
                await trio.sleep(0.05)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    async def wait(self, within_s: float = 60.0) -> int:
        with trio.fail_after(within_s):
            return await self.proc.wait()

    async def get(self, path: str) -> tuple[int, bytes]:
        def fetch() -> tuple[int, bytes]:
            try:
                with urllib.request.urlopen(self.admin + path, timeout=10) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as err:
                return err.code, err.read()

        return await trio.to_thread.run_sync(fetch)


async def start_replica(config: Path, name: str, *, wait_ready: bool = True,
                        keep_stdout: bool = False) -> ReplicaProcess:
    """Start ``integrationd run``; its stderr (the log) goes to ``NAME.log`` and, with
    ``keep_stdout``, its stdout to ``NAME.out`` (else it is discarded)."""
    log = config.parent / f"{name}.log"
    handle = log.open("wb")
    out = (config.parent / f"{name}.out").open("wb") if keep_stdout else None
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "daemon.cli", "--config", str(config), "run"],
        stdout=out if out is not None else subprocess.DEVNULL, stderr=handle,
        cwd=str(config.parent), env=cli_env(),
    )
    handle.close()
    if out is not None:
        out.close()
    replica = ReplicaProcess(proc, log)
    if wait_ready:
        started = await replica.wait_event("replica_started", within_s=60)
        replica.admin = str(started["admin"])
    return replica


async def stop_all(replicas: list[ReplicaProcess]) -> None:
    for r in replicas:
        if r.proc.returncode is None:
            r.kill()
            await r.wait()


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody reaped yet (in a container whose
    init does not reap, a killed orphan stays a zombie: ``kill(pid, 0)`` still works)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
