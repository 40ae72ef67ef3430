"""The systemd unit verifies, and the replica speaks the notify protocol (READY, STOPPING)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.support.backends import FreshDatabase
from tests.support.processes import REPO, cli_env, write_config

UNIT = REPO / "systemd" / "integrationd@.service"


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze is part of the test toolchain"
    venv_bin = Path(sys.executable).parent
    text = UNIT.read_text().replace("/opt/integrationd/.venv/bin", str(venv_bin))
    (tmp_path / "integrationd@.service").write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", "./integrationd@1.service"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@pytest.mark.parametrize(
    "directive",
    [
        "Type=notify",
        "WatchdogSec=",
        "LoadCredential=storage-password:",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "User=integrationd",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
    ],
)
def test_unit_keeps_its_hardening_and_lifecycle(directive: str) -> None:
    assert any(line.startswith(directive) for line in UNIT.read_text().splitlines())


def test_unit_exit_statuses_match_the_documented_exit_codes() -> None:
    from daemon.cli import EXIT_FAILURE, EXIT_FORCED, EXIT_OK, EXIT_USAGE

    directives = dict(
        line.split("=", 1) for line in UNIT.read_text().splitlines()
        if line and not line.startswith("#") and "=" in line
    )
    assert directives["SuccessExitStatus"] == str(EXIT_FORCED)
    assert directives["RestartForceExitStatus"] == str(EXIT_FORCED)
    assert directives["RestartPreventExitStatus"] == str(EXIT_USAGE)
    assert directives["Restart"] == "on-failure"  # restarts EXIT_FAILURE
    table = (REPO / "docs" / "operations.md").read_text()
    for code in (EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_FORCED):
        assert f"\n| {code} |" in table, f"exit code {code} is not documented"


@pytest.mark.slow
async def test_replica_notifies_ready_and_stopping(database: FreshDatabase,
                                                   tmp_path: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(sock_path))
    listener.setblocking(False)
    cfg = write_config(tmp_path / "a.toml", database.url)
    env = cli_env()
    env["NOTIFY_SOCKET"] = str(sock_path)
    env["WATCHDOG_USEC"] = "2000000"
    messages: list[str] = []
    try:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "daemon.cli", "--config", str(cfg), "run"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            cwd=str(tmp_path),
        )
        tsock = trio.socket.from_stdlib_socket(listener)
        with trio.fail_after(60):
            while not any("READY=1" in m for m in messages):
                messages.append((await tsock.recv(4096)).decode())
            while not any("WATCHDOG=1" in m for m in messages):
                messages.append((await tsock.recv(4096)).decode())
            proc.send_signal(15)
            while not any("STOPPING=1" in m for m in messages):
                messages.append((await tsock.recv(4096)).decode())
            assert await proc.wait() == 0
    finally:
        listener.close()
