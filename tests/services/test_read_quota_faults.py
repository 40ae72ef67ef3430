"""A provider read's quota reservation through the provider's answers, against the real
Outreach simulator on every backend (cursor reconciliation's list page, the reconcile
rig of test_cursor_reconcile): a 429 moves the shared budget forward for everyone and
defers the run to that time (no request until then, no attempt charged); a reset after
the request left counts the slot as spent; a refused connection gives it back."""

from __future__ import annotations

import attrs

from config.catalog import build_catalog, load_definitions, load_object_binding_documents
from daemon.core.outcomes import Deferred, RetryLater, Succeeded
from daemon.core.quota import ReservationState
from daemon.core.work import WorkItem
from daemon.providers.executor import BoundedHttp
from daemon.services.catalog_view import CatalogView, publish_current
from daemon.services.effect_quota import MAX_WAIT_US
from daemon.services.reconcile import CursorReconciler, RunPayload
from sandbox.hubspot_sim.model import Fault
from sandbox.ports import free_port
from storage.port import SqlTx, WorkQuery
from tests.services import test_cursor_reconcile
from tests.services.test_cursor_reconcile import BINDING, Rig, seed
from tests.support.work import SEC

KEY = f"outreach:per_user_hour:org-1:{BINDING}"
rig = test_cursor_reconcile.rig  # the fixture


async def _reservations(r: Rig) -> list[ReservationState]:
    (item,) = await r.store.work_list(WorkQuery(family="cursor_reconcile"))
    return [x.state for x in await r.store.quota_reservations(item.work_id)]


async def _key(r: Rig) -> tuple[int, int, int]:
    (view,) = [k for k in await r.store.quota_keys("outreach:") if k.quota_key == KEY]
    return view.throttles_total, view.granted_total, view.returned_total


async def test_a_429_moves_the_budget_and_defers_the_run_to_that_time(rig: Rig) -> None:
    seed(rig.sim, 3)
    rig.sim.inject(Fault(mode="rate_limit", path_prefix="/api/v2/prospects",
                         retry_after_s=7))
    await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
    t0 = rig.clock.now
    outcome = await rig.run()
    assert isinstance(outcome, Deferred) and outcome.reason == "quota_throttled"
    assert outcome.run_after_us == t0 + 7 * SEC
    assert await _reservations(rig) == [ReservationState.SENT]  # it did reach the provider
    throttles, granted, returned = await _key(rig)
    assert (throttles, granted, returned) == (1, 1, 0)
    (item,) = await rig.store.work_list(WorkQuery(family="cursor_reconcile"))
    assert item.attempt == 0 and item.run_after_us == t0 + 7 * SEC  # not charged
    # Claimed early anyway (another replica, a clock ahead): the ledger, not the item,
    # says no; nothing is sent.
    before = len(rig.sim.requests)
    early = await rig.run(await _claim_now(rig))
    assert isinstance(early, Deferred) and early.reason == "quota_wait"
    # (the time a claim may take the slot the 429 left, waiting at most MAX_WAIT_US)
    assert early.run_after_us == t0 + 7 * SEC - MAX_WAIT_US
    assert len(rig.sim.requests) == before
    # At the time the budget allows: listed.
    rig.clock.now = t0 + 7 * SEC
    assert isinstance(await rig.run(await _claim_now(rig)), Succeeded)
    assert len([r for r in rig.sim.requests if r.status == 200]) == 1


async def _claim_now(r: Rig) -> WorkItem:
    """Claim the deferred run whatever its run_after (a peer replica's clock ahead)."""
    async def due(tx: SqlTx) -> None:
        await tx.execute("UPDATE work_items SET run_after_us = ? WHERE family = ?",
                         (r.clock.now, "cursor_reconcile"))

    await r.store.db.transact(due, name="test.due")
    return await r.claimed()


async def test_a_reset_after_sending_is_spent_a_refused_connect_comes_back(
        rig: Rig) -> None:
    seed(rig.sim, 3)
    rig.sim.inject(Fault(mode="reset_after", path_prefix="/api/v2/prospects"))
    await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
    outcome = await rig.run()
    assert isinstance(outcome, RetryLater) and outcome.failure_class == "list_unreachable"
    assert await _reservations(rig) == [ReservationState.SPENT_UNKNOWN]
    assert (await _key(rig))[2] == 0  # counted as spent: never returned


async def test_a_refused_connect_gives_the_slot_back(rig: Rig) -> None:
    # The same binding at a port nobody listens on: the request never left.
    dead = attrs.evolve(rig.binding, base_url=f"http://127.0.0.1:{free_port()}")
    _, documents = load_definitions()
    catalog = build_catalog(4, documents, (dead,), load_object_binding_documents())
    await publish_current(rig.store, catalog, actor="test", role="admin", reason="dead",
                          now_us=rig.clock.now)
    http = BoundedHttp.open(2)
    try:
        rig.reconciler = CursorReconciler(max_attempts=5, inbound_max_attempts=5, catalog=catalog,
                                          catalogs=CatalogView(rig.store, catalog), http=http)
        rig.catalog, rig.binding = catalog, dead
        await rig.enqueue(RunPayload(binding=BINDING, resource="prospect"))
        refused = await rig.run()
        assert isinstance(refused, RetryLater) and refused.failure_class == "list_unreachable"
        assert await _reservations(rig) == [ReservationState.RELEASED]
        assert (await _key(rig))[1:] == (1, 1)  # granted, and the capacity came back
    finally:
        await http.aclose()
