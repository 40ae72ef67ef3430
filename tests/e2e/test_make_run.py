"""``make run`` as a newcomer runs it (issue 23 item 6): the Makefile's own target, in a
scratch directory, with config/example.toml on free ports. The banner comes after the
replica answers /readyz, and SIGTERM to make's process drains the replica and stops the
sandbox: nothing is left running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sandbox.ports import free_port
from tests.support.processes import alive

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"
PORTS = (8780, 8781, 8782, 8790, 8791, 8793)


def _pids(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True,
                           check=False)
    return [int(p) for p in found.stdout.split()]


def test_sigterm_to_make_run_stops_the_replica_and_the_sandbox(tmp_path: Path) -> None:
    assert (VENV / "bin" / ".installed-run").exists(), "run `make .venv/bin/.installed-run`"
    text = (ROOT / "config" / "example.toml").read_text()
    for port in PORTS:
        text = text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{free_port()}")
    cfg = tmp_path / "make-run.toml"
    cfg.write_text(text)
    admin = re.search(r'\[admin\]\n(?:#.*\n|\w.*\n)*?listen = "([^"]+)"', text)
    assert admin is not None
    out = (tmp_path / "make.out").open("wb")
    make = subprocess.Popen(
        ["make", "--no-print-directory", "-C", str(tmp_path), "-f", str(ROOT / "Makefile"),
         f"VENV={VENV}", "-o", f"{VENV}/bin/.installed-run", f"CONFIG={cfg}", "run"],
        stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "MAKEFLAGS": ""})
    out.close()
    try:
        deadline = time.monotonic() + 240
        while "stop: Ctrl-C" not in (tmp_path / "make.out").read_text(errors="replace"):
            assert make.poll() is None, (tmp_path / "make.out").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "make.out").read_text()[-3000:]
            time.sleep(0.2)
        shown = (tmp_path / "make.out").read_text(errors="replace")
        # The banner names the configured console and comes after the replica listens.
        assert f"console: http://{admin.group(1)}/admin/" in shown
        assert shown.index('"event":"replica_started"') < shown.index("console: http://")
        replica = _pids(f"--config {cfg} run")
        sandbox = _pids(f"-m sandbox --config {cfg}")
        assert replica and sandbox, (replica, sandbox)
        make.send_signal(signal.SIGTERM)  # to make alone, as a service manager would
        make.wait(timeout=90)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in replica + sandbox) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in replica + sandbox if alive(p)]
        assert left == [], f"still running after SIGTERM to make: {left}"
        assert '"event":"replica_stopped"' in (tmp_path / "make.out").read_text()
    finally:
        if make.poll() is None:
            make.kill()
        for pid in _pids(f"--config {cfg}"):
            os.kill(pid, signal.SIGKILL)
