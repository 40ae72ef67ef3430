"""Cursor reconciliation against the real Outreach simulator and real storage on every
backend: pages through records sharing one updatedAt, overlap without doubles, the
cursor checkpointed with the page's items, a stale claimant writing nothing, the safety
lag, bounded repair, and the next run queued as a WorkItem."""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio

from config.catalog import Catalog, build_catalog, load_definitions, load_object_binding_documents
from config.settings import BindingSettings, Secret
from daemon.core.cursor import iso_from_ns
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY, InboundChange
from daemon.core.inbound_flow import remote_time_ns
from daemon.core.outcomes import Outcome, RetryLater, Succeeded
from daemon.core.work import WorkItem
from daemon.providers.executor import BoundedHttp
from daemon.services.catalog_view import CatalogView, publish_current
from daemon.services.families import WorkContext
from daemon.services.metrics import Metrics
from daemon.services.reconcile import (
    RECONCILE_FAMILY,
    CursorReconciler,
    RunPayload,
    run_spec,
    stream_key,
)
from sandbox.hubspot_sim.model import Fault
from sandbox.outreach_sim import OutreachSimulator
from storage.port import LostLease, SqlTx, WorkQuery
from storage.reconcile import StreamState, read_stream
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, claim, finalization

TOKEN = "s2s-token-reconcile"
BINDING = "outreach-main"
SHARED = "2026-06-01T00:00:00.000Z"  # before T0 (2027): past every horizon


@attrs.define
class Clock:
    now: int = T0

    def now_us(self) -> int:
        return self.now


@attrs.define(eq=False)
class Rig:
    store: WorkStore
    sim: OutreachSimulator
    reconciler: CursorReconciler
    catalog: Catalog
    binding: BindingSettings
    clock: Clock
    completed: list[float] = attrs.field(factory=list)

    async def enqueue(self, run: RunPayload, number: int = 0) -> None:
        await self.store.work_enqueue([run_spec(self.catalog, self.binding, run,
                                                number=number, max_attempts=5)], self.clock.now)

    async def claimed(self, owner: str = "A") -> WorkItem:
        result = await claim(self.store, owner=owner, now=self.clock.now,
                             family=RECONCILE_FAMILY)
        (item,) = result.claimed
        return item

    async def run(self, item: WorkItem | None = None, owner: str = "A") -> Outcome:
        item = item or await self.claimed(owner)
        assert item.fence is not None
        ctx = WorkContext(item=item, fence=item.fence, store=self.store, clock=self.clock,
                          replica_id=owner)
        outcome = await self.reconciler.handle(ctx)
        writes = list(ctx.side_writes)

        async def all_writes(tx: SqlTx) -> None:
            for write in writes:
                await write(tx)

        (done,) = await self.store.work_finalize_if_owner(
            [finalization(item, outcome, self.clock.now)], owner, lambda: self.clock.now,
            {item.work_id: all_writes} if writes else None)
        assert done.applied
        return outcome

    async def offered(self) -> list[InboundChange]:
        items = await self.store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY, limit=1000))
        return [InboundChange.from_payload(i.payload) for i in items]

    async def stream(self) -> StreamState:
        async def body(tx: SqlTx) -> StreamState:
            return await read_stream(tx, stream_key(BINDING, "prospect"), BINDING, "prospect")

        return await self.store.db.transact(body, name="test.stream", write=False)


def catalog_with_page_size(binding: BindingSettings, page_size: int) -> Catalog:
    _, documents = load_definitions()
    objects = copy.deepcopy(load_object_binding_documents())
    for doc in objects:
        doc["reconcile"]["page_size"] = page_size
    return build_catalog(3, documents, (binding,), objects)


@pytest.fixture
async def rig(store: WorkStore, nursery: trio.Nursery) -> AsyncIterator[Rig]:
    sim = OutreachSimulator(tokens={TOKEN})
    port = await nursery.start(sim.run)
    binding = BindingSettings(binding_id=BINDING, provider="outreach", org_id="org-1",
                              app_installation_id="app-1", remote_account_id="org-77",
                              base_url=f"http://127.0.0.1:{port}", auth="static_token",
                              token=Secret(TOKEN))
    catalog = catalog_with_page_size(binding, 7)
    await publish_current(store, catalog, actor="test", role="admin", reason="reconcile",
                          now_us=T0)
    http = BoundedHttp.open(4)
    r = Rig(store, sim, CursorReconciler(
        inbound_max_attempts=5, catalog=catalog, catalogs=CatalogView(store, catalog),
        http=http, max_attempts=5), catalog, binding, Clock())
    r.reconciler.on_complete = lambda stream, through: r.completed.append(through)
    try:
        yield r
    finally:
        await http.aclose()


def seed(sim: OutreachSimulator, n: int, **attributes: Any) -> None:
    for i in range(1, n + 1):
        sim.put_prospect({"firstName": f"P{i}", **attributes}, prospect_id=i)


async def test_pages_through_one_shared_updated_at_once_each_and_queue_the_next_run(
        rig: Rig) -> None:
    seed(rig.sim, 30)
    rig.sim.bulk_update(list(range(1, 26)), {"stage": "cold"}, updated_at=SHARED,
                        notify=False)
    for i in range(26, 31):
        rig.sim.update_prospect(i, {"stage": "warm"},
                                updated_at=f"2026-06-01T00:00:0{i - 25}.000Z", notify=False)
    await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
    outcome = await rig.run()
    assert outcome == Succeeded("30 records offered to the inbound Flow")
    offered = await rig.offered()
    assert sorted(int(c.resource_id) for c in offered) == list(range(1, 31))
    # The stream's first run is its initial sync: offered as a repair (no webhook owed).
    assert {c.origin for c in offered} == {"repair"} and {c.kind for c in offered} == {
        "observed"}
    assert all(c.origin_id.startswith("initial:") for c in offered)
    # 30 records in pages of 7: five list requests, all for updatedAt ascending.
    lists = [r for r in rig.sim.requests if r.path == "/api/v2/prospects"]
    assert len(lists) == 5 and all("sort=updatedAt" in r.query for r in lists)
    state = await rig.stream()
    assert state.cursor is not None
    assert (state.cursor.record_id, state.cursor.updated_at) == ("30",
                                                                 "2026-06-01T00:00:05.000Z")
    # Complete through the horizon: the run's now less the 30 s safety lag.
    assert state.runs == 1 and rig.completed == [(rig.clock.now - 30 * SEC) / 1e6]
    # The next run is a WorkItem due one interval later, keyed by its run number.
    (nxt,) = [i for i in await rig.store.work_list(WorkQuery(family=RECONCILE_FAMILY))
              if i.state.value == "pending"]
    assert nxt.run_after_us == rig.clock.now + 300 * SEC
    assert nxt.dedupe_key == f"reconcile:{BINDING}:prospect:run:1"

    # One change later; the next run re-lists the overlap but doubles nothing.
    rig.sim.update_prospect(3, {"stage": "hot"}, updated_at="2026-06-01T00:00:09.000Z",
                            notify=False)
    rig.clock.now += 301 * SEC
    assert isinstance(await rig.run(), Succeeded)
    offered = await rig.offered()
    # The second run re-lists the overlap (120 s before the cursor: every record here, 3 at
    # its new version) as reconcile-origin changes: offered once more after the
    # initial sync (the Flow's watermarks make the re-offer of an applied version a no-op),
    # never twice within an origin.
    later = [c for c in offered if c.origin == "reconcile"]
    assert sorted(int(c.resource_id) for c in later) == list(range(1, 31))
    assert len({c.origin_id for c in offered}) == len(offered) == 60
    # A third run over the same versions offers nothing new.
    rig.clock.now += 301 * SEC
    assert isinstance(await rig.run(), Succeeded)
    assert len(await rig.offered()) == 60
    assert sorted(c.remote_updated_at or "" for c in offered if c.resource_id == "3") == [
        SHARED, "2026-06-01T00:00:09.000Z"]


async def test_a_stale_claimant_checkpoints_nothing_and_the_next_loses_nothing(
        rig: Rig) -> None:
    seed(rig.sim, 12)
    rig.sim.bulk_update(list(range(1, 13)), {}, updated_at=SHARED, notify=False)
    await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
    stale = await rig.claimed("A")
    rig.clock.now += 60 * SEC  # A's lease ran out while it fetched
    live = await rig.claimed("B")
    assert stale.fence is not None
    with pytest.raises(LostLease):
        await rig.reconciler.handle(WorkContext(item=stale, fence=stale.fence,
                                                store=rig.store, clock=rig.clock,
                                                replica_id="A"))
    assert await rig.offered() == []
    assert (await rig.stream()).cursor is None
    assert isinstance(await rig.run(live, owner="B"), Succeeded)
    assert sorted(int(c.resource_id) for c in await rig.offered()) == list(range(1, 13))


async def test_records_within_the_safety_lag_wait_for_the_next_run(rig: Rig) -> None:
    seed(rig.sim, 2)
    rig.sim.update_prospect(1, {}, updated_at=SHARED, notify=False)
    # Prospect 2 changed 10 s before "now": its webhook may still be on its way.
    recent = (T0 - 10 * SEC) * 1000
    rig.sim.update_prospect(2, {"stage": "x"}, updated_at=iso_from_ns(recent), notify=False)
    await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
    assert await rig.run() == Succeeded("1 records offered to the inbound Flow")
    assert [c.resource_id for c in await rig.offered()] == ["1"]


async def test_an_unreadable_page_is_a_retry_and_keeps_what_was_checkpointed(
        rig: Rig) -> None:
    seed(rig.sim, 10)
    rig.sim.bulk_update(list(range(1, 11)), {}, updated_at=SHARED, notify=False)
    # The second list request fails.
    rig.sim.inject(Fault(mode="latency", path_prefix="/api/v2/prospects", latency_ms=0))
    rig.sim.inject(Fault(mode="status", status=503, path_prefix="/api/v2/prospects"))
    await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
    outcome = await rig.run()
    assert isinstance(outcome, RetryLater) and outcome.failure_class == "list_503"
    assert len(await rig.offered()) == 7
    assert (await rig.stream()).cursor is not None


async def test_a_bounded_repair_offers_only_its_period_and_leaves_the_cursor(
        rig: Rig) -> None:
    seed(rig.sim, 3)
    stamps = ["2026-01-01T00:00:00.000Z", "2026-02-01T00:00:00.000Z",
              "2026-03-01T00:00:00.000Z"]
    for i, stamp in enumerate(stamps, start=1):
        rig.sim.update_prospect(i, {}, updated_at=stamp, notify=False)
    run = RunPayload(binding=BINDING, resource="prospect", mode="repair", run_id="rep-1",
                     from_ns=remote_time_ns("2026-01-15T00:00:00Z"),
                     until_ns=remote_time_ns("2026-02-15T00:00:00Z"))
    await rig.enqueue(run)
    assert await rig.run() == Succeeded("1 records offered to the inbound Flow")
    (change,) = await rig.offered()
    assert (change.resource_id, change.origin) == ("2", "repair")
    assert change.dedupe_key.startswith("inbound:repair:rep-1:")
    assert (await rig.stream()).cursor is None
    assert [i for i in await rig.store.work_list(WorkQuery(family=RECONCILE_FAMILY))
            if i.state.value == "pending"] == []  # a repair queues no next run


def test_the_sync_lag_grows_at_scrape_time_until_the_next_run() -> None:
    metrics = Metrics()
    metrics.set_sync_complete("outreach-main:prospect", time.time() - 100)
    lag = metrics.registry.get_sample_value("integrationd_sync_lag_seconds",
                                            {"stream": "outreach-main:prospect"})
    assert lag is not None and 100 <= lag < 160


async def test_a_listed_fractional_number_is_offered_as_its_exact_decimal_text(
        rig: Rig) -> None:
    """Outreach's scores carry fractions. A listed record with one was not JSON the
    WorkItem payload could hold (canonical JSON has no floats), so the run failed; it is
    offered with the number's exact decimal text (amounts travel as strings)."""
    seed(rig.sim, 2)
    rig.sim.update_prospect(2, {"engagedScore": 0.1}, notify=False)
    await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
    assert await rig.run() == Succeeded("2 records offered to the inbound Flow")
    scored = [c for c in await rig.offered() if c.resource_id == "2"]
    assert [c.attributes["engagedScore"] for c in scored] == ["0.1"]


async def test_listed_changes_pin_the_account_they_were_listed_from(rig: Rig) -> None:
    seed(rig.sim, 3)
    await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
    assert await rig.run() == Succeeded("3 records offered to the inbound Flow")
    assert {c.remote_account for c in await rig.offered()} == {"org-77"}
