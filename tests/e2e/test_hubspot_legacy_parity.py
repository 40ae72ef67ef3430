"""The HubSpot Lead.Title slice against its parity oracle (seed 11.2), on every backend.

The reference legacy owner's ConnectorPush-shaped executor (``sandbox/legacy/push.py``)
and integrationd's command -> WorkItem -> EffectAttempt path push the same title
changes to the same simulator, for twin leads. Item by item they must agree: the
same remote record (the linked contact), the same sparse body, one attempt,
local completion, and operator evidence naming the same target and status.
"""

from __future__ import annotations

import json
import time

from sandbox.legacy import store as legacy
from sandbox.legacy.push import run_pushes, title_event
from storage.work_store import WorkStore
from tests.support.attempts import sent_attempts
from tests.support.backends import FreshDatabase
from tests.support.slice import HUBSPOT_TOKEN, running_slice

TITLES = ("CTO", "VP Sales", "Head of Ops")
FAMILY = "lead_title_push"


async def test_legacy_push_and_integrationd_agree_item_by_item(
    database: FreshDatabase, store: WorkStore,
) -> None:
    async with running_slice(store, database.url) as sl:
        await legacy.install(store)
        for n, _ in enumerate(TITLES):
            await sl.lead(f"old-{n}", f"10{n}")
            await sl.lead(f"new-{n}", f"20{n}")
        now = time.time_ns() // 1000
        await legacy.add_events(store, FAMILY, [
            title_event(f"old-{n}", f"10{n}", t) for n, t in enumerate(TITLES)], now)
        ran = await run_pushes(store, FAMILY, "legacy-1", sl.http,
                               f"http://127.0.0.1:{sl.hubspot_port}", HUBSPOT_TOKEN, now)
        assert ran == len(TITLES)
        intents = [await sl.set_title(f"new-{n}", t) for n, t in enumerate(TITLES)]
        committed = [await sl.wait_intent(f"new-{n}", i, "COMMITTED")
                     for n, i in enumerate(intents)]
        by_lead = {json.loads(e.payload)["lead_id"]: e
                   for e in await legacy.events(store, FAMILY)}
        for n, title in enumerate(TITLES):
            old_id, new_id = f"10{n}", f"20{n}"
            (old,) = sl.patches(old_id)  # one attempt each
            (new,) = sl.patches(new_id)
            assert old.body_sha256 == new.body_sha256  # the same sparse payload
            assert (old.status, old.applied) == (new.status, new.applied) == (200, True)
            assert old.path.replace(old_id, "{id}") == new.path.replace(new_id, "{id}")
            for contact, lead in ((old_id, f"old-{n}"), (new_id, f"new-{n}")):
                props = sl.sim.contact(contact)["properties"]  # type: ignore[index]
                assert props["jobtitle"] == title
                assert props["email"] == f"{lead}@example.com"  # nothing else touched
            # Local completion.
            event = by_lead[f"old-{n}"]
            assert (event.state, event.attempts, event.outcome) == ("succeeded", 1,
                                                                    "succeeded")
            assert committed[n]["status"] == "COMMITTED"
            # Operator evidence: same target (its linked record), status and remote id.
            evidence = json.loads(event.evidence or "{}")
            command_id = committed[n]["command_id"]
            assert isinstance(command_id, str)
            (attempt,) = sent_attempts(await store.effect_attempts(command_id))
            assert evidence["method"] == attempt.method == "PATCH"
            assert evidence["target_path"].replace(old_id, "{id}") == \
                attempt.target_path.replace(new_id, "{id}")
            assert evidence["status"] == attempt.response_status == 200
            assert evidence["remote_id"] == old_id
            assert json.loads(attempt.provider_evidence or "{}")["id"] == new_id
            doc = await sl.lead_doc(f"new-{n}")
            assert doc["remote_id"] == new_id  # the same remote link the legacy owner used
            assert "Bearer" not in (event.evidence or "")
