"""Provider reads take quota like effects: against the real Outreach simulator, the real
reference Runtime and a real replica (the Outreach slice) on every backend, with a tight
L1 quota (4 requests per 2 s, sliding, a burst of 2) beside Outreach's hourly one,
effects (PATCH), the inbound Flow's hydration GETs and cursor reconciliation's list
pages all run at once. The simulator's journal of arrivals is judged in every window of
the quota's own length: any excess fails the test, as would a single 429. Each read
holds its own reservation record (no effect attempt), and a read that found no slot was
deferred to the ledger's time (``quota_wait``), never retried or charged an attempt."""

from __future__ import annotations

from pathlib import Path

import trio

from config.catalog import load_catalog
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY, InboundChange
from daemon.services.clock import WallClock
from daemon.services.reconcile import RECONCILE_FAMILY, RunPayload, run_spec
from storage.idgen import new_ulid
from storage.port import SqlTx, WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.l1 import write_sandbox_definitions
from tests.support.outreach_slice import BINDING, running_outreach_slice
from tests.support.slice import SCOPE

LIMIT, WINDOW_S = 4, 2.0
TIGHT = (f'[quota.tight]\nlimit = {LIMIT}\nwindow = {WINDOW_S}\nscope = "binding"\n'
         'kind = "sliding"\nburst = 2\njitter = 1.0\n\n')
LEADS = 4
HYDRATIONS = 4
LISTS = 2


def _definitions(tmp_path: Path) -> str:
    directory = write_sandbox_definitions(tmp_path / "l1")
    outreach = directory / "outreach.toml"
    head, sep, rest = outreach.read_text().partition("[quota.per_user_hour]")
    assert sep
    outreach.write_text(head + TIGHT + sep + rest)
    return str(directory)


def _worst_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    worst, j = 0, 0
    for i, start in enumerate(times):
        while j < len(times) and times[j] < start + window_s:
            j += 1
        worst = max(worst, j - i)
    return worst


async def test_effects_hydration_and_list_reads_share_one_budget_and_never_exceed_it(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path,
                                      definitions_dir=_definitions(tmp_path)) as sl:
        catalog = load_catalog(sl.settings)
        binding = catalog.binding(BINDING)
        assert binding is not None
        assert {q.name for q in catalog.operations["outreach.prospect.update_title"].quotas
                } == {"tight", "per_user_hour"}
        prospects = [500 + i for i in range(LEADS)]
        for i, pid in enumerate(prospects):
            await sl.lead(f"lead-{i}", pid)
        await trio.sleep(WINDOW_S)  # the setup's own requests out of the window
        first_request = len(sl.sim.requests)
        # The three kinds of provider call, all at once.
        for i in range(LEADS):
            await sl.set_title(f"lead-{i}", "CTO")
        now = WallClock().now_us()
        changes = [InboundChange(
            provider="outreach", binding=BINDING, resource_type="prospect",
            resource_id=str(pid), kind="updated", attributes={"firstName": "Ada"},
            origin="webhook", origin_id=f"evt-quota-{pid}")  # no updatedAt: hydrated
            for pid in prospects[:HYDRATIONS]]
        runs = [run_spec(catalog, binding, RunPayload(
            binding=BINDING, resource="prospect", mode="repair", run_id=new_ulid(now + n)),
            number=0, max_attempts=5) for n in range(LISTS)]
        await store.work_enqueue([
            *(c.work_spec(org_id=SCOPE.org_id, catalog_revision=catalog.revision,
                          catalog_digest=catalog.digest) for c in changes), *runs], now)
        assert sl.replica is not None
        sl.replica.wake(INBOUND_APPLY_FAMILY)
        sl.replica.wake(RECONCILE_FAMILY)

        async def settled() -> bool:
            patches = [r for r in sl.sim.requests[first_request:] if r.method == "PATCH"]
            gets = [r for r in sl.sim.requests[first_request:]
                    if r.method == "GET" and r.path.startswith("/api/v2/prospects/")]
            lists = [r for r in sl.sim.requests[first_request:]
                     if r.method == "GET" and r.path == "/api/v2/prospects"]
            return (len(patches) >= LEADS and len(gets) >= HYDRATIONS
                    and len(lists) >= LISTS)

        await wait_for(settled, within_s=90)
        await trio.sleep(WINDOW_S)  # whatever follows (the Flow's own steps) lands too
        calls = sl.sim.requests[first_request:]
        assert {r.status for r in calls} <= {200, 204}, [(r.method, r.status) for r in calls]
        # The provider's own definition: any 2 s window sees at most 4 arrivals, of
        # every kind together.
        worst = _worst_window([r.received_at for r in calls], WINDOW_S)
        assert worst <= LIMIT, worst
        assert worst >= 3, worst  # the budget was really used to its limit
        assert len(calls) >= LEADS + HYDRATIONS + LISTS

        # Every read holds its own reservation (no effect attempt), moved to "sent".
        async def reservations(tx: SqlTx) -> list[tuple[str, str | None]]:
            rows = await tx.fetchall(
                "SELECT r.state, r.attempt_id FROM quota_reservations r"
                " WHERE r.quota_key LIKE ?", ("outreach:tight:%",))
            return [(str(r[0]), None if r[1] is None else str(r[1])) for r in rows]

        held = await store.db.transact(reservations, name="t", write=False)
        reads = [s for s, attempt in held if attempt is None]
        effects = [s for s, attempt in held if attempt is not None]
        assert len(effects) >= LEADS
        assert len(reads) >= HYDRATIONS + LISTS
        assert set(reads) <= {"sent", "released"} and reads.count("sent") >= (
            HYDRATIONS + LISTS)
        # Waiting reads were deferred to the ledger's time: never retried, no attempt
        # charged for the wait.
        deferred = 0
        for family in (INBOUND_APPLY_FAMILY, RECONCILE_FAMILY):
            for item in await store.work_list(WorkQuery(family=family, limit=100)):
                executions = await store.work_executions(item.work_id)
                deferred += sum(1 for e in executions if e.reason == "quota_wait")
                assert not [e for e in executions if e.outcome == "retry" and (
                    e.reason or "").startswith(("hydrate_429", "list_429"))]
        assert deferred >= 1, "no read ever waited: the budget was not shared"
