"""Unresolved means unresolved (issue 8 item 6): an attempt left with no outcome by a drain
mid-dispatch is listed and counted with the unknown ones, on the console's JSON API.

Real parts: the HubSpot simulator (a PATCH slower than the drain deadline), the reference
Runtime, the replica's work loop, drain and console on loopback.
"""

from __future__ import annotations

import pytest

from daemon.core.states import WorkState
from sandbox.hubspot_sim import Fault
from storage.bounded import BoundedCount
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.e2e.test_effect_console import closing, signed_in
from tests.support.attempts import sent_attempts
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import running_slice
from tests.ui.support import _OPERATORS

pytestmark = pytest.mark.slow


async def test_an_attempt_left_without_outcome_by_a_drain_awaits_a_disposition(
    database: FreshDatabase, store: WorkStore
) -> None:
    async with running_slice(store, database.url, operators=_OPERATORS,
                             drain_timeout=0.5) as sl:
        await sl.lead("lead-1", "101")
        sl.sim.inject(Fault(mode="latency", method="PATCH", latency_ms=4000))
        await sl.set_title("lead-1", "CTO")

        # The latency fault is taken when the PATCH arrives: it is at the provider (an
        # attempt journaled and then held back by our own side never gets there).
        await wait_for(lambda: not sl.sim.pending_faults(), within_s=30)
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        otto, _ = await signed_in(sl, "otto")
        async with closing(otto):
            # In flight under a live claim: not (yet) awaiting anyone.
            listed = (await otto.get("/admin/api/effects/unknown")).json()
            assert listed["attempts"] == []
        assert sl.replica is not None
        # The drain deadline (0.5 s) comes before the PATCH's answer (4 s) or the
        # client's timeout (5 s): the handler is stopped mid-dispatch, its item released.
        sl.replica.request_drain()
        await wait_for(lambda: sl.replica.state == "stopped", within_s=30)  # type: ignore[union-attr]
        released = await store.work_get(item.work_id)
        assert released is not None and released.state is WorkState.RETRY
        (attempt,) = sent_attempts(await store.effect_attempts(item.subject_id))
        assert attempt.outcome is None and attempt.disposition is None
        assert [a.attempt_id for a in await store.effect_unknown_list()] == [attempt.attempt_id]
        assert await store.effect_unknown_backlog() == 1
        assert await store.effect_unresolved_counts() == (BoundedCount(0), BoundedCount(1))
