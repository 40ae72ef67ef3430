"""Start-up survives a database that is still coming up; a database that refuses us is
reported as such, at once. Real processes, a real MariaDB (behind a proxy that refuses
connections while the "server is down").

Finding: with the database down at boot, ``run`` exited 1 at once, so under the
unit's restart limits a database that takes 15 s to start left the service
failed for good.
"""

from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path

import pytest
import trio

from daemon.cli import EXIT_OK, EXIT_USAGE
from tests.support.backends import MYSQL_URL
from tests.support.chaos_proxy import proxied_mysql
from tests.support.harness import wait_for
from tests.support.processes import cli_env, run_cli, start_replica, stop_all, write_config

pytestmark = [pytest.mark.slow, pytest.mark.mysql]

WAIT = "connect_timeout = 1.0\nstartup_timeout = 120.0"
SLACK_S = 20.0  # interpreter start-up on a loaded machine


def plain_lines(stderr: str) -> list[str]:
    return [line for line in stderr.strip().splitlines() if not line.startswith("{")]


async def test_run_waits_for_a_database_still_coming_up_and_is_not_ready_meanwhile(
    tmp_path: Path,
) -> None:
    async with proxied_mysql(tmp_path) as px:
        cfg = write_config(tmp_path / "a.toml", px.url, storage_extra=WAIT)
        px.proxy.refuse()  # the server is down at boot
        a = await start_replica(cfg, "a", wait_ready=False)
        try:
            a.admin = str((await a.wait_event("http_listening", within_s=60))["address"])
            await wait_for(lambda: sum(e["event"] == "database_waiting" for e in a.events()) >= 2,
                           within_s=60)
            status, body = await a.get("/readyz")
            assert status == 503
            assert json.loads(body)["ready"] is False and json.loads(body)["state"] == "starting"
            assert a.proc.returncode is None  # still waiting, not failed
            px.proxy.restore()  # the server is up
            await a.wait_event("replica_started", within_s=60)

            async def ready() -> bool:
                return (await a.get("/readyz"))[0] == 200

            await wait_for(ready, within_s=30)
        finally:
            a.terminate()
            assert await a.wait() == EXIT_OK
            await stop_all([a])
        events = a.events()
        tries = [e for e in events if e["event"] == "database_waiting"]
        assert [e["attempt"] for e in tries] == list(range(1, len(tries) + 1))
        assert all(0 < e["retry_in_s"] <= 5.0 for e in tries)  # backoff, capped
        reachable = next(e for e in events if e["event"] == "database_reachable")
        assert reachable["attempts"] == len(tries) + 1


async def test_sigterm_while_waiting_for_the_database_stops_at_once_and_cleanly(
    tmp_path: Path,
) -> None:
    async with proxied_mysql(tmp_path) as px:
        cfg = write_config(tmp_path / "a.toml", px.url, storage_extra=WAIT)
        px.proxy.refuse()
        a = await start_replica(cfg, "a", wait_ready=False)
        try:
            await a.wait_event("database_waiting", within_s=60)
            a.terminate()  # nothing claimed yet: nothing to drain
            assert await a.wait(within_s=SLACK_S) == EXIT_OK
        finally:
            await stop_all([a])
        names = [e["event"] for e in a.events()]
        assert "replica_stopped_before_start" in names and "replica_started" not in names


async def test_migrate_waits_for_a_database_still_coming_up(tmp_path: Path) -> None:
    async with proxied_mysql(tmp_path, migrated=False) as px:
        cfg = write_config(tmp_path / "a.toml", px.url, storage_extra=WAIT)
        px.proxy.refuse()
        results = []

        async def migrate() -> None:
            results.append(await trio.to_thread.run_sync(run_cli, cfg, "migrate"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(migrate)
            await wait_for(lambda: px.proxy.refused >= 2, within_s=60)
            px.proxy.restore()
        (result,) = results
        assert result.returncode == EXIT_OK, result.stderr
        assert "migrations applied: [" in result.stdout
        assert '"event":"database_waiting"' in result.stderr


@pytest.mark.parametrize(
    ("url", "password", "reason"),
    [
        # MariaDB says 1698 when no password was given, MySQL 1045.
        ("mysql://integrationd_nosuchuser@{hostport}/test", None, r"access denied \((1045|1698)\)"),
        ("mysql://{user}@{hostport}/test", "not-the-password", r"access denied \(1045\)"),
        ("mysql://{user}@{hostport}/itest_no_such_database", None, r"unknown database \(1049\)"),
    ],
    ids=["unknown-user", "wrong-password", "unknown-database"],
)
@pytest.mark.parametrize("command", ["run", "migrate"])
async def test_a_database_that_refuses_us_is_reported_as_such_and_exits_2_at_once(
    tmp_path: Path, url: str, password: str | None, reason: str, command: str
) -> None:
    base = MYSQL_URL.split("://", 1)[1].split("/", 1)[0]  # user@host:port
    user, hostport = base.split("@", 1)
    url = url.format(user=user, hostport=hostport)
    cfg = write_config(tmp_path / "a.toml", url, storage_extra=WAIT)
    env = cli_env()
    if password is not None:
        env["INTEGRATIOND_STORAGE_PASSWORD"] = password
    started = time.monotonic()
    result = await trio.to_thread.run_sync(functools.partial(run_cli, cfg, command, env=env))
    elapsed = time.monotonic() - started
    assert result.returncode == EXIT_USAGE, result.stderr
    (line,) = plain_lines(result.stderr)
    assert re.match(re.escape(f"integrationd: database refused us ({url}): ") + reason, line), line
    assert "unreachable" not in result.stderr and "Traceback" not in result.stderr
    assert '"database_waiting"' not in result.stderr  # not retried: waiting cannot fix it
    if password is not None:
        assert password not in result.stderr + result.stdout
    assert elapsed < SLACK_S, elapsed  # at once, not after storage.startup_timeout (120 s)
