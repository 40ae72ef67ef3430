"""The cutover fault matrix (seed 13, the cutover items) with real processes.

Real ``integrationd run`` replicas, real reference legacy workers
(``sandbox.legacy.worker``) and a real step driver, on SQLite and MariaDB;
SIGTERM, SIGSTOP/SIGCONT and SIGKILL. Every invariant is read from the
database at the end: each legacy event was executed by exactly one owner,
no fence committed while anything of integrationd could still execute, and
receipts and projections converge.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from daemon.core.cutover import Phase
from daemon.core.outcomes import Succeeded
from sandbox.legacy import store as legacy
from storage.cutover.values import CutoverBlocked
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.cutover import legacy_states, params, spec, states
from tests.support.cutover_driver import STEPS
from tests.support.harness import wait_for
from tests.support.legacy import sandbox_claimant
from tests.support.processes import cli_env, start_replica, stop_all, write_config
from tests.support.work import claim, finalize

pytestmark = pytest.mark.slow
PROBE = sandbox_claimant()
BOUND_US = 500_000  # the claim-transaction bound these tests run with


def wall_us() -> int:
    return time.time_ns() // 1000


async def _legacy_worker(url: str, name: str, hold_s: float = 0.02) -> trio.Process:
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "sandbox.legacy.worker", url, "noop", name, str(hold_s)],
        stdout=subprocess.DEVNULL, env=cli_env())
    return proc


async def _executed_once(store: WorkStore, events: int) -> None:
    """Each legacy event ran under exactly one owner: the legacy owner finished it,
    or its WorkItem succeeded under integrationd -- never both, never neither --
    and no WorkItem ran more than once."""

    async def body(tx: SqlTx) -> list[tuple[object, ...]]:
        return await tx.fetchall(
            "SELECT e.event_id, e.state, w.state, (SELECT COUNT(*) FROM work_executions x"
            " WHERE x.work_id = w.work_id AND x.outcome = 'succeeded')"
            " FROM legacy_events e LEFT JOIN work_items w ON w.dedupe_key = e.work_key")

    rows = await store.db.transact(body, name="t.once", write=False)
    assert len(rows) == events
    for event_id, legacy_state, work_state, runs in rows:
        by_legacy = legacy_state == "succeeded"
        by_us = work_state == "succeeded"
        assert by_legacy != by_us, (event_id, legacy_state, work_state)
        assert int(str(runs)) == (1 if by_us else 0), (event_id, runs)
        if by_legacy and work_state is not None:
            assert work_state == "reconciled_legacy_terminal", (event_id, work_state)


async def _stop(procs: list[trio.Process]) -> None:
    for p in procs:
        if p.returncode is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    with trio.fail_after(60):
        for p in procs:
            await p.wait()


async def test_forward_cutover_drains_legacy_then_admits_integrationd(
    database: FreshDatabase, store: WorkStore, tmp_path: Path,
) -> None:
    await legacy.install(store)
    await legacy.add_events(store, "noop", ["{}"] * 40, wall_us())
    workers = [await _legacy_worker(database.url, f"legacy-{i}") for i in range(2)]
    cfg = write_config(tmp_path / "r.toml", database.url, lease_ttl=5.0, lease_margin=1.0)
    replicas = []
    try:
        async def legacy_started() -> bool:
            return (await legacy_states(store)).get("succeeded", 0) >= 5

        await wait_for(legacy_started, within_s=90)
        await store.cutover_begin(params(bound_us=BOUND_US), wall_us())
        # Materialize while nobody may claim; replicas start and find nothing to claim.
        await legacy.materialize(store, "noop", "org-1", wall_us())
        replicas = [await start_replica(cfg, f"r{i}") for i in range(2)]
        await trio.sleep(1.0)
        assert (await states(store)).get("succeeded", 0) == 0
        with pytest.raises(CutoverBlocked) as exc:
            await store.cutover_commit(params(bound_us=BOUND_US), wall_us(), PROBE)
        assert "legacy_processes" in [b.code for b in exc.value.blockers]
        await _stop(workers)  # SIGTERM: they finish what they hold and report stopped
        await legacy.materialize(store, "noop", "org-1", wall_us())
        await store.cutover_commit(params(bound_us=BOUND_US), wall_us(), PROBE)

        async def drained() -> bool:
            return await store.work_count_open("noop") == 0

        await wait_for(drained, within_s=120)
        await _executed_once(store, 40)
        assert (await legacy_states(store)).get("processing", 0) == 0
    finally:
        await _stop(workers)
        await stop_all(replicas)


async def test_sigstopped_replica_waking_after_the_fence_cannot_claim(
    database: FreshDatabase, store: WorkStore, tmp_path: Path,
) -> None:
    await legacy.install(store)
    await store.cutover_begin(params(), wall_us())
    await store.cutover_commit(params(), wall_us(), PROBE)
    cfg = write_config(tmp_path / "r.toml", database.url, lease_ttl=5.0, lease_margin=1.0)
    a = await start_replica(cfg, "a")
    b = await start_replica(cfg, "b")
    a_id = str((await a.wait_event("replica_started"))["replica"])
    workers: list[trio.Process] = []
    try:
        a.proc.send_signal(signal.SIGSTOP)  # frozen between two polls
        await store.cutover_rollback_begin(params(bound_us=BOUND_US), wall_us())
        await legacy.add_events(store, "noop", ["{}"] * 10, wall_us())
        assert await legacy.materialize(store, "noop", "org-1", wall_us()) == 10
        b.terminate()
        assert await b.wait() == 0
        await trio.sleep(BOUND_US / 1e6)
        with pytest.raises(CutoverBlocked) as exc:
            await store.cutover_rollback_commit(params(bound_us=BOUND_US), wall_us())
        assert [x.code for x in exc.value.blockers] == ["replicas_live"]
        assert a_id in exc.value.blockers[0].sentence
        # An operator (wrongly) proves the frozen replica gone: the fence commits.
        await store.process_mark_gone(a_id, params(), wall_us())
        fenced_at = wall_us()
        done = await store.cutover_rollback_commit(params(bound_us=BOUND_US), fenced_at)
        assert done.moved == 10
        a.proc.send_signal(signal.SIGCONT)  # it wakes up after the fence

        async def a_is_back() -> bool:
            rows = [r for r in await store.replica_list(fenced_at) if r.replica_id == a_id]
            return bool(rows) and rows[0].state == "running"

        await wait_for(a_is_back, within_s=60)
        await trio.sleep(2.0)  # many claim polls of the woken replica
        assert await states(store) == {"awaiting_legacy_outcome": 10}

        async def executions_since(tx: SqlTx) -> int:
            rows = await tx.fetchall(
                "SELECT COUNT(*) FROM work_executions WHERE finished_at_us >= ?", (fenced_at,))
            return int(rows[0][0])

        assert await store.db.transact(executions_since, name="t", write=False) == 0
        # The woken replica reports itself live again: the next proof sees it.
        snap = (await store.cutover_snapshot("noop", wall_us(), PROBE))[1]
        assert a_id in snap.replicas
        # The legacy owner now runs the fenced work; receipts confirm the fence.
        workers = [await _legacy_worker(database.url, "legacy-1")]

        async def legacy_done() -> bool:
            return (await legacy_states(store)).get("succeeded", 0) == 10

        await wait_for(legacy_done, within_s=90)
        await _stop(workers)
        while (await store.legacy_project(wall_us())).projected:
            pass
        assert await states(store) == {"reconciled_legacy_terminal": 10}
        await _executed_once(store, 10)
    finally:
        await _stop(workers)
        a.proc.send_signal(signal.SIGCONT)
        await stop_all([a, b])


async def _driver(url: str, pause: bool) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.support.cutover_driver", url, "noop",
         "1" if pause else "0"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=cli_env())


async def _read_done(proc: trio.Process) -> int:
    assert proc.stdout is not None
    data = b""
    while not data.endswith(b"\n"):
        chunk = await proc.stdout.receive_some(256)
        assert chunk, "driver exited early"
        data += chunk
    return int(json.loads(data.splitlines()[-1])["done"])


@pytest.mark.parametrize("killed_after", range(len(STEPS)))
async def test_rollback_and_re_cutover_converge_after_sigkill_between_steps(
    database: FreshDatabase, store: WorkStore, killed_after: int,
) -> None:
    await legacy.install(store)
    await legacy.add_events(store, "noop", ["{}"] * 6, wall_us())
    await store.cutover_begin(params(), wall_us())
    await legacy.materialize(store, "noop", "org-1", wall_us())
    await store.cutover_commit(params(), wall_us(), PROBE)
    for _ in range(2):  # integrationd executes two items before the rollback
        (item,) = (await claim(store, now=wall_us(), limit=1)).claimed
        assert (await finalize(store, item, Succeeded(), now=wall_us())).applied
    first = await _driver(database.url, pause=True)
    with trio.fail_after(120):
        while await _read_done(first) < killed_after:
            assert first.stdin is not None
            await first.stdin.send_all(b"go\n")
        first.send_signal(signal.SIGKILL)
        await first.wait()
    again = await _driver(database.url, pause=False)
    with trio.fail_after(120):
        assert again.stdout is not None
        while await again.stdout.receive_some(256):
            pass
        assert await again.wait() == 0
    gen = await store.owner_generation_get("noop")
    assert gen is not None and gen.phase is Phase.INTEGRATIOND_ACTIVE
    receipts = await store.cutover_receipts("noop")
    assert [(r.generation, r.kind) for r in receipts] == [
        (3, "cutover"), (2, "rollback"), (1, "cutover")]
    assert receipts[1].fenced_count == 4
    assert await states(store) == {"succeeded": 2, "reconciled_legacy_terminal": 4}
    assert await legacy_states(store) == {"succeeded": 4, "pending": 2}
    (fence,) = await store.legacy_fence_progress("noop")
    assert fence.confirmed and fence.reconciled == 4
    await _executed_once(store, 6)


async def test_rollback_never_admits_legacy_while_a_frozen_lease_could_run(
    database: FreshDatabase, store: WorkStore, tmp_path: Path,
) -> None:
    await legacy.install(store)
    await store.cutover_begin(params(), wall_us())
    await store.cutover_commit(params(), wall_us(), PROBE)
    cfg = write_config(tmp_path / "r.toml", database.url, lease_ttl=3.0, lease_margin=1.0)
    a = await start_replica(cfg, "a")
    a_id = str((await a.wait_event("replica_started"))["replica"])
    b = None
    try:
        (slow,) = await store.work_enqueue([spec(payload='{"sleep_ms": 4000}')], wall_us())

        async def held() -> bool:
            item = await store.work_get(slow.work_id)
            return item is not None and item.state.value == "processing"

        await wait_for(held, within_s=60)
        a.proc.send_signal(signal.SIGSTOP)  # frozen while it holds the lease
        await store.cutover_rollback_begin(params(bound_us=BOUND_US), wall_us())
        await trio.sleep(BOUND_US / 1e6)
        with pytest.raises(CutoverBlocked) as exc:
            await store.cutover_rollback_commit(params(bound_us=BOUND_US), wall_us())
        assert [x.code for x in exc.value.blockers] == ["processing", "replicas_live"]
        await store.process_mark_gone(a_id, params(), wall_us())
        await trio.sleep(3.5)  # the lease expires; reclaim is stopped
        with pytest.raises(CutoverBlocked) as exc:
            await store.cutover_rollback_commit(params(bound_us=BOUND_US), wall_us())
        assert [x.code for x in exc.value.blockers] == ["expired_leases"]
        a.proc.send_signal(signal.SIGCONT)  # it wakes: its lease is gone, it can change nothing
        await trio.sleep(2.0)
        with pytest.raises(CutoverBlocked):
            await store.cutover_rollback_commit(params(bound_us=BOUND_US), wall_us())
        gen = await store.owner_generation_get("noop")
        assert gen is not None and gen.phase is Phase.ROLLBACK_DRAINING  # legacy never admitted
        assert [r.kind for r in await store.cutover_receipts("noop")] == ["cutover"]
        # Abandoning the rollback reopens admission: the item is reclaimed and runs.
        await store.cutover_commit(params(bound_us=BOUND_US), wall_us(), PROBE)
        b = await start_replica(cfg, "b")

        async def finished() -> bool:
            item = await store.work_get(slow.work_id)
            return item is not None and item.state.value == "succeeded"

        await wait_for(finished, within_s=90)
        outcomes = [e.outcome for e in await store.work_executions(slow.work_id)]
        assert outcomes.count("succeeded") == 1
    finally:
        a.proc.send_signal(signal.SIGCONT)
        await stop_all([a] + ([b] if b is not None else []))
