"""Exit codes and one-line errors that mean something: real ``integrationd run`` processes.

Findings: a second signal exited 0 like a clean drain; a port already in use
was a 75-line traceback; two live processes could run with one replica id;
hypercorn's "Running on ..." banner was logged as an event name.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import attrs
import pytest
import trio

from daemon.cli import EXIT_FORCED, EXIT_OK, EXIT_USAGE
from daemon.core.states import WorkState
from storage.port import ReplicaInfo
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.processes import ReplicaProcess, start_replica, stop_all, write_config
from tests.support.work import enqueue

pytestmark = pytest.mark.slow

NAMED = 'id = "worker-1"'


def wall_us() -> int:
    return time.time_ns() // 1000


def plain_lines(text: str) -> list[str]:
    return [line for line in text.strip().splitlines() if not line.startswith("{")]


async def _processing(store: WorkStore, wid: str) -> bool:
    item = await store.work_get(wid)
    return item is not None and item.state is WorkState.PROCESSING


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_second_signal_is_a_forced_stop_with_its_own_exit_code(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url, drain_timeout=600.0)
    (wid,) = await enqueue(store, now=wall_us(), payload='{"sleep_ms": 600000}')
    a = await start_replica(cfg, "a")
    try:
        await wait_for(lambda: _processing(store, wid), within_s=60)
        a.terminate()
        await a.wait_event("replica_draining")
        a.terminate()  # the operator insists
        assert await a.wait(within_s=60) == EXIT_FORCED
    finally:
        await stop_all([a])
    assert EXIT_FORCED not in (EXIT_OK, 1, EXIT_USAGE)
    forced = next(e for e in a.events() if e["event"] == "replica_forced_stop")
    assert forced["abandoned"] == 1 and forced["reason"].startswith("second signal")
    item = await store.work_get(wid)
    assert item is not None and item.state is WorkState.PROCESSING  # left to lease expiry


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_port_in_use_is_one_line_naming_the_listener_and_port(
    backend: str, database: FreshDatabase, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = write_config(tmp_path / "a.toml", database.url, admin_listen=f"127.0.0.1:{port}")
        a = await start_replica(cfg, "a", wait_ready=False)
        assert await a.wait(within_s=60) == EXIT_USAGE
    text = a.log.read_text()
    assert "Traceback" not in text
    assert plain_lines(text) == [
        f"integrationd: admin listener 127.0.0.1:{port}: port {port} is already in use"
    ]


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_two_live_processes_with_one_replica_id_refuse_to_run_side_by_side(
    backend: str, database: FreshDatabase, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url, replica_extra=NAMED)
    a = await start_replica(cfg, "a")
    try:
        b = await start_replica(cfg, "b", wait_ready=False)
        assert await b.wait(within_s=60) == EXIT_USAGE
        (line,) = plain_lines(b.log.read_text())
        assert re.fullmatch(
            r"integrationd: replica id 'worker-1' is in use by a live process \(\S+ pid \d+\):"
            r" give each replica its own replica.id", line), line
        assert a.proc.returncode is None  # the first one runs on
        assert not any(e["event"] == "replica_started" for e in b.events())
    finally:
        a.terminate()
        assert await a.wait() == EXIT_OK


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_restart_after_a_crash_takes_over_at_once_when_the_old_process_is_gone(
    backend: str, database: FreshDatabase, tmp_path: Path
) -> None:
    # Heartbeats 30 s apart: only the pid check can explain a take-over within the lapse.
    cfg = write_config(tmp_path / "a.toml", database.url, replica_extra=NAMED,
                       heartbeat_interval=30.0)
    a = await start_replica(cfg, "a")
    a.kill()  # crash: the row still says "running", with a fresh heartbeat
    await a.wait()
    b = await start_replica(cfg, "b")
    try:
        took = next(e for e in b.events() if e["event"] == "replica_id_taken_over")
        assert took["reason"] == "previous holder's process is gone"
        assert took["previous_pid"] == a.proc.pid
        assert not any(e["event"] == "replica_id_watch" for e in b.events())  # no waiting
    finally:
        b.terminate()
        assert await b.wait() == EXIT_OK


def _foreign(now_us: int, state: str = "running") -> ReplicaInfo:
    return ReplicaInfo(replica_id="worker-1", hostname="some-other-host", pid=4242,
                       version="0.1.0", state=state, families="[]", started_at_us=now_us - 10,
                       heartbeat_at_us=now_us)


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_restart_takes_over_once_the_old_heartbeat_lapsed(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    # A holder on another host that crashed a moment ago: nothing can prove it gone but
    # the silence of its heartbeat.
    await store.replica_heartbeat(_foreign(wall_us()))
    # Heartbeats 4 s apart: a 12 s lapse, longer than b takes to start on a loaded machine.
    cfg = write_config(tmp_path / "a.toml", database.url, replica_extra=NAMED,
                       heartbeat_interval=4.0)
    b = await start_replica(cfg, "b")
    try:
        names = [e["event"] for e in b.events()]
        assert names.index("replica_id_watch") < names.index("replica_id_taken_over")
        took = next(e for e in b.events() if e["event"] == "replica_id_taken_over")
        assert took["reason"] == "previous heartbeat lapsed"
        assert took["previous_host"] == "some-other-host"
    finally:
        b.terminate()
        assert await b.wait() == EXIT_OK


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_live_holder_on_another_host_is_refused(
    backend: str, database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url, replica_extra=NAMED)
    async with trio.open_nursery() as nursery:
        async def beat() -> None:
            started = wall_us()
            while True:  # a live process: same start, a fresh heartbeat every 0.3 s
                await store.replica_heartbeat(
                    attrs.evolve(_foreign(wall_us()), started_at_us=started))
                await trio.sleep(0.3)

        nursery.start_soon(beat)
        b = await start_replica(cfg, "b", wait_ready=False)
        assert await b.wait(within_s=60) == EXIT_USAGE
        nursery.cancel_scope.cancel()
    (line,) = plain_lines(b.log.read_text())
    assert "replica id 'worker-1' is in use by a live process (some-other-host pid 4242)" in line


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_log_events_are_stable_names_never_a_server_banner(
    backend: str, database: FreshDatabase, tmp_path: Path
) -> None:
    cfg = write_config(tmp_path / "a.toml", database.url)
    a: ReplicaProcess = await start_replica(cfg, "a")
    try:
        status, _ = await a.get("/healthz")
        assert status == 200
    finally:
        a.terminate()
        assert await a.wait() == EXIT_OK
    names = [e["event"] for e in a.events()]
    assert names and all(re.fullmatch(r"[a-z][a-z0-9_]*", n) for n in names), names
    listening = next(e for e in a.events() if e["event"] == "http_listening")
    assert listening["address"] == a.admin
    assert plain_lines(a.log.read_text()) == []  # every stderr line is a structured event


INGRESS_ROUTE = """
[[bindings]]
binding_id = "o"
provider = "outreach"
org_id = "org"
app_installation_id = "i"
remote_account_id = "a"
base_url = "http://127.0.0.1:1"

[[webhook_routes]]
route = "o"
binding_id = "o"
webhook = "outreach.prospect_events"
"""


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_ingress_port_in_use_names_the_ingress_listener(
    backend: str, database: FreshDatabase, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = write_config(tmp_path / "a.toml", database.url, extra=(
            f'\n[ingress]\nlisten = "127.0.0.1:{port}"\nspool_dir = "spool"\n'
            + INGRESS_ROUTE))
        a = await start_replica(cfg, "a", wait_ready=False)
        assert await a.wait(within_s=60) == EXIT_USAGE
    text = a.log.read_text()
    assert "Traceback" not in text
    assert plain_lines(text) == [
        f"integrationd: ingress listener 127.0.0.1:{port}: port {port} is already in use"
    ]
