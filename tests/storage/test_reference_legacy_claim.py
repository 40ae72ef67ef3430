"""The reference legacy claimant works through every eligible event (issue 21, item 5).

Events whose WorkItems integrationd already executed stay ``pending`` in the
legacy owner's own table for ever (it never ran them, and must not): its claim
loop has to look past them to the fenced work behind them, however many there are.
"""

from __future__ import annotations

from daemon.core.outcomes import Released, Succeeded
from sandbox.legacy import store as legacy
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.cutover import legacy_states, params, states
from tests.support.legacy import sandbox_claimant
from tests.support.work import SEC, T0, claim, finalize

EVENTS = 12
RUN_BY_INTEGRATIOND = 6  # the lowest event ids: ahead of the fenced ones in id order


async def _work_ids_by_event(store: WorkStore) -> list[str]:
    async def body(tx: SqlTx) -> list[str]:
        rows = await tx.fetchall(
            "SELECT w.work_id FROM legacy_events e JOIN work_items w"
            " ON w.dedupe_key = e.work_key ORDER BY e.event_id")
        return [str(r[0]) for r in rows]

    return await store.db.transact(body, name="t.by_event", write=False)


async def test_legacy_worker_moves_past_events_integrationd_already_ran(
    store: WorkStore,
) -> None:
    await legacy.install(store)
    await legacy.add_events(store, "noop", ["{}"] * EVENTS, T0)
    await store.cutover_begin(params(), T0)
    assert await legacy.materialize(store, "noop", "org-1", T0) == EVENTS
    await store.cutover_commit(params(), T0, sandbox_claimant())
    first = set((await _work_ids_by_event(store))[:RUN_BY_INTEGRATIOND])
    claimed = (await claim(store, limit=EVENTS)).claimed
    assert len(claimed) == EVENTS
    for item in claimed:
        # The first events by id ran here; the rest go back unstarted, for the fence.
        outcome = Succeeded() if item.work_id in first else Released()
        assert (await finalize(store, item, outcome)).applied
    await store.cutover_rollback_begin(params(), T0)
    done = await store.cutover_rollback_commit(params(), T0)
    assert done.moved == EVENTS - RUN_BY_INTEGRATIOND
    executed = 0
    while (ev := await legacy.claim_one(store, "noop", "legacy-1", 60 * SEC, T0)) is not None:
        assert await legacy.finish(store, ev, "legacy-1", "succeeded", T0)
        executed += 1
    assert executed == EVENTS - RUN_BY_INTEGRATIOND
    assert await legacy_states(store) == {"succeeded": EVENTS - RUN_BY_INTEGRATIOND,
                                          "pending": RUN_BY_INTEGRATIOND}
    while (await store.legacy_project(T0)).projected:
        pass
    assert await states(store) == {"succeeded": RUN_BY_INTEGRATIOND,
                                   "reconciled_legacy_terminal": EVENTS - RUN_BY_INTEGRATIOND}
