"""Issue 8, item 11: a provider 2xx is checked against the pinned target.

Today's code settled any 2xx as success without looking at the body, so a 200
that names another record committed a success receipt for an effect that never
happened. The L1 definition says where a response names its record
(``response.identity``); a mismatch is OUTCOME_UNKNOWN, reconciled by read-back.
"""

from __future__ import annotations

import json

import trio

from sandbox.hubspot_sim import Fault
from storage.effect_values import Settlement
from storage.work_store import WorkStore
from tests.support.attempts import sent_attempts
from tests.support.backends import FreshDatabase
from tests.support.slice import running_slice


async def test_a_200_naming_another_record_is_not_settled_as_success(
        database: FreshDatabase, store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-1", "101")
        await trio.sleep(0.3)  # the contact's last change is older than the clock-skew margin
        sl.sim.inject(Fault(mode="other_record", method="PATCH", record_id="202"))
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "COMMITTED")

        # The misrouted 200 changed nothing; reconciliation read the contact back,
        # proved the first PATCH absent once the in-flight window had passed, and
        # dispatched again: the title really is there, applied exactly once.
        first, second = sl.patches("101")
        assert (first.status, first.applied) == (200, False)
        assert (second.status, second.applied) == (200, True)
        assert sl.sim.patches_applied("101") == 1
        assert sl.sim.contact("101")["properties"]["jobtitle"] == "CTO"  # type: ignore[index]

        command_id = str(intent["command_id"])
        command = await store.command_get(command_id)
        assert command is not None and command.settlement is Settlement.SUCCEEDED
        misrouted, applied = sent_attempts(await store.effect_attempts(command_id))
        assert (misrouted.outcome, misrouted.failure_class) == ("OUTCOME_UNKNOWN",
                                                                "identity_mismatch")
        assert misrouted.disposition == "proven_absent"
        assert json.loads(misrouted.provider_evidence or "{}")["id"] == "202"
        assert applied.outcome == "ACCEPTED"
