"""A hung database never hangs the daemon: real ``integrationd`` processes, a real MariaDB
behind a proxy that stops forwarding (as when the server is SIGSTOPped).

Findings: ``run``, ``work list`` and ``work depths`` hung for minutes with no
output, and a SIGTERM drain with ``drain_timeout = 5`` exited after about 40 s.
Time bounds here are generous (loaded CI machines); the measured figure is
printed (``pytest -s``) and recorded in docs/operations.md.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import pytest
import trio

from daemon.cli import EXIT_FAILURE, EXIT_FORCED
from daemon.core.states import WorkState
from daemon.services.replica import DRAIN_MARGIN_S
from tests.support.chaos_proxy import proxied_mysql
from tests.support.harness import wait_for
from tests.support.processes import run_cli, start_replica, stop_all, write_config
from tests.support.work import enqueue

pytestmark = [pytest.mark.slow, pytest.mark.mysql]

BOUNDS = "connect_timeout = 1.0\nstatement_timeout = 1.0"
# Interpreter start-up and imports on a loaded machine, on top of the bounds under test.
SLACK_S = 20.0


def wall_us() -> int:
    return time.time_ns() // 1000


def plain_lines(stderr: str) -> list[str]:
    """stderr minus the structured (JSON) log lines: what an operator reads as the error."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("{")]


async def test_cli_verbs_fail_in_one_line_within_the_bound_on_a_hung_database(
    tmp_path: Path,
) -> None:
    async with proxied_mysql(tmp_path) as px:
        cfg = write_config(tmp_path / "a.toml", px.url, storage_extra=BOUNDS)
        px.proxy.freeze()
        for verb in (["work", "list"], ["work", "depths"]):
            started = time.monotonic()
            result = await trio.to_thread.run_sync(functools.partial(run_cli, cfg, *verb))
            elapsed = time.monotonic() - started
            assert result.returncode == EXIT_FAILURE, result.stderr
            assert plain_lines(result.stderr) == [
                f"integrationd: database unreachable ({px.url}): no answer within 1s"
                " (storage.connect_timeout)"
            ]
            assert elapsed < 1.0 + SLACK_S, elapsed


async def test_run_at_start_on_a_hung_database_logs_each_try_and_gives_up_in_one_line(
    tmp_path: Path,
) -> None:
    async with proxied_mysql(tmp_path) as px:
        cfg = write_config(tmp_path / "a.toml", px.url,
                           storage_extra=BOUNDS + "\nstartup_timeout = 4.0")
        px.proxy.freeze()
        started = time.monotonic()
        a = await start_replica(cfg, "a", wait_ready=False)
        try:
            listening = await a.wait_event("http_listening", within_s=60)
            a.admin = str(listening["address"])
            await a.wait_event("database_waiting", within_s=30)
            status, body = await a.get("/readyz")
            assert status == 503 and json.loads(body)["ready"] is False
            assert await a.wait(within_s=4.0 + SLACK_S) == EXIT_FAILURE
        finally:
            await stop_all([a])
        elapsed = time.monotonic() - started
        assert elapsed < 4.0 + SLACK_S, elapsed
        tries = [e for e in a.events() if e["event"] == "database_waiting"]
        assert len(tries) >= 2 and all("storage.connect_timeout" in e["error"] for e in tries)
        assert [e["attempt"] for e in tries] == list(range(1, len(tries) + 1))
        (line,) = plain_lines(a.log.read_text())
        assert line.startswith(f"integrationd: database unreachable ({px.url}): ")
        assert "storage.startup_timeout" in line


async def test_drain_on_a_hung_database_ends_within_drain_timeout_plus_margin(
    tmp_path: Path,
) -> None:
    async with proxied_mysql(tmp_path) as px:
        store = await px.database.open_store()
        cfg = write_config(tmp_path / "a.toml", px.url, drain_timeout=5.0, lease_ttl=120.0,
                           lease_margin=5.0, storage_extra="connect_timeout = 2.0\n"
                           "statement_timeout = 3.0")
        (slow,) = await enqueue(store, now=wall_us(), payload='{"sleep_ms": 600000}')
        a = await start_replica(cfg, "a")
        try:
            async def running() -> bool:
                item = await store.work_get(slow)
                return item is not None and item.state is WorkState.PROCESSING

            await wait_for(running, within_s=60)

            async def handler_started() -> bool:  # the claim's COMMIT answer arrived too
                text = (await a.get("/metrics"))[1].decode()
                return 'integrationd_work_in_flight{family="noop"} 1.0' in text

            await wait_for(handler_started, within_s=60)
            px.proxy.freeze()
            started = time.monotonic()
            a.terminate()
            code = await a.wait(within_s=60)
            elapsed = time.monotonic() - started
        finally:
            await stop_all([a])
        print(f"\nhung-database drain, drain_timeout = 5: exit {code} after {elapsed:.2f}s"
              f" (bound 5 + {DRAIN_MARGIN_S:g} s margin)")
        assert code == EXIT_FORCED  # leases were abandoned: not a clean drain
        assert elapsed < 5.0 + DRAIN_MARGIN_S + SLACK_S, elapsed
        assert elapsed >= 5.0  # the in-flight work did get its drain_timeout
        events = a.events()
        (abandoned,) = [e for e in events if e["event"] == "replica_drain_abandoned"]
        assert abandoned["work_ids"] == slow and abandoned["left_to"] == "lease expiry"
        assert events[-1]["event"] == "replica_stopped" and events[-1]["forced"] == "drain_deadline"
        px.proxy.thaw()
        # Nothing was released behind the database's back: the lease simply expires.
        item = await store.work_get(slow)
        assert item is not None and item.state is WorkState.PROCESSING
        assert item.ownership_epoch == 1


async def test_console_mirror_verbs_fail_in_one_line_within_the_bound_on_a_hung_database(
    tmp_path: Path,
) -> None:
    """``audit list`` and ``dlq list`` open their store with the configured bounds too (they
    used the built-in 5 s / 15 s whatever ``[storage]`` said)."""
    async with proxied_mysql(tmp_path) as px:
        cfg = write_config(tmp_path / "a.toml", px.url, storage_extra=BOUNDS)
        px.proxy.freeze()
        for verb in (["audit", "list"], ["dlq", "list"]):
            started = time.monotonic()
            result = await trio.to_thread.run_sync(functools.partial(run_cli, cfg, *verb))
            elapsed = time.monotonic() - started
            assert result.returncode == EXIT_FAILURE, result.stderr
            (line,) = plain_lines(result.stderr)
            assert line.startswith(f"integrationd: database unreachable ({px.url}):"), line
            assert "no answer within 1s" in line, line
            assert elapsed < 1.0 + SLACK_S, elapsed
