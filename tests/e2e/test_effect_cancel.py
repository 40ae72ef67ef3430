"""Cancel per family over real HTTP (issue 8 item 7): an operator's cancel cannot stop an
effect mid-dispatch, and a receipt cannot be cancelled.

Real parts: the HubSpot simulator (a slow PATCH), the reference Runtime, the replica's
work loop and console on loopback.
"""

from __future__ import annotations

import pytest

from daemon.core.states import WorkState
from sandbox.hubspot_sim import Fault
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.e2e.test_effect_console import closing, signed_in
from tests.support.attempts import sent_attempts
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import running_slice
from tests.ui.support import _OPERATORS

pytestmark = pytest.mark.slow


async def test_an_operator_cancel_never_stops_an_effect_mid_dispatch(
    database: FreshDatabase, store: WorkStore
) -> None:
    async with running_slice(store, database.url, operators=_OPERATORS) as sl:
        await sl.lead("lead-1", "101")
        sl.sim.inject(Fault(mode="latency", method="PATCH", latency_ms=3000))
        intent_id = await sl.set_title("lead-1", "CTO")

        # The latency fault is taken when the PATCH arrives: it is at the provider (an
        # attempt journaled and then held back by our own side never gets there).
        await wait_for(lambda: not sl.sim.pending_faults(), within_s=30)
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        otto, csrf = await signed_in(sl, "otto")
        async with closing(otto):
            r = await otto.post(f"/admin/api/work/{item.work_id}/cancel",
                                json={"reason": "stop it"}, headers={"X-CSRF-Token": csrf})
            # Refused with a clear reason: the PATCH is at the provider.
            assert r.status_code == 409, r.text
            assert "not classified yet" in r.json()["message"]
            await sl.wait_intent("lead-1", intent_id, "COMMITTED", within_s=30)
            done = await store.work_get(item.work_id)
            assert done is not None and done.state is WorkState.SUCCEEDED
            (attempt,) = sent_attempts(await store.effect_attempts(item.subject_id))
            assert attempt.outcome == "ACCEPTED"
            # The receipt that released the intent: its item can never be cancelled.
            (receipt_item,) = await store.work_list(WorkQuery(family="runtime_receipt"))
            r = await otto.post(f"/admin/api/work/{receipt_item.work_id}/cancel",
                                json={"reason": "stop it"}, headers={"X-CSRF-Token": csrf})
            assert r.status_code == 409
            assert (await store.audit_list(target_id=item.work_id)) == []
        assert [p.applied for p in sl.patches("101")] == [True]
