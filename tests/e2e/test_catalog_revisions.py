"""One pinned Catalog revision per execution (seed 13), end to end, on every backend.

The finding: ``catalog_digest`` was stored and never compared, and the
revision was checked only at admission and replay, so queued and retrying
commands dispatched under whatever definition the replica served *now*.
Here the replica serves revision 8 (another PATCH path, one more allowed
property) while the Runtime's commands name revision 7: they run, retries
included, exactly as revision 7 defines them.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import attrs

from config.catalog import build_catalog, load_documents
from daemon.core.canonical import canonical_digest
from daemon.core.handoff import EffectHandoffKey
from daemon.services.catalog_view import publish_current
from daemon.services.clock import WallClock
from sandbox.hubspot_sim import Fault
from storage.effect_values import Settlement
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.commands import draft
from tests.support.harness import wait_for
from tests.support.slice import REVISION, RUNTIME_TOKEN, SCOPE, Slice, running_slice

V8_SUFFIX = "/v8"


def _revision_8(suffix: str = V8_SUFFIX) -> list[Any]:
    """The shipped L1 definitions with another path and one more allowed property."""
    documents = copy.deepcopy(load_documents())
    for doc in documents:
        for table in doc.get("operations", {}).values():
            table["request"]["path"] = table["request"]["path"] + suffix
            table["allowed_fields"] = [*table["allowed_fields"], "email"]
    return documents


def _body(intent_id: str, lead: str, revision: int, properties: dict[str, str]
          ) -> dict[str, Any]:
    command = {
        "intent_id": intent_id, "intent_kind": "UPSERT",
        "operation": "hubspot.contact.update_jobtitle",
        "logical_target": {"object": "lead", "lead_id": lead},
        "catalog_revision": revision, "request": {"properties": properties},
    }
    return {"effect_handoff_key": EffectHandoffKey(SCOPE, intent_id).encode(),
            "payload_digest": canonical_digest(command),
            "runtime_outbox_id": f"outbox-{intent_id}", "command": command}


async def _post(sl: Slice, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    r = await sl.http.post(f"{sl.api_url}/v1/commands", json=doc,
                           headers={"Authorization": f"Bearer {RUNTIME_TOKEN}"})
    return r.status_code, r.json()


async def test_queued_and_retried_commands_dispatch_under_their_pinned_revision_not_the_served_one(
        database: FreshDatabase, store: WorkStore) -> None:
    async with running_slice(store, database.url, served_documents=_revision_8()) as sl:
        assert sl.settings.catalog.revision == REVISION + 1  # what the replica serves now
        await sl.lead("lead-1", "101")
        sl.sim.inject(Fault(mode="rate_limit", method="PATCH"))  # first attempt: 429, retried
        intent_id = await sl.set_title("lead-1", "CTO")
        await wait_for(lambda: bool(sl.patches("101")), within_s=30)
        # Mid-flight, with the retry queued: yet another revision is published.
        await publish_current(store, build_catalog(REVISION + 2, _revision_8("/v9"),
                                                   sl.settings.bindings),
                              actor="test", role="admin", reason="mid-flight",
                              now_us=WallClock().now_us())
        intent = await sl.wait_intent("lead-1", intent_id, "COMMITTED")

        patches = sl.patches("101")
        assert [(p.path, p.status) for p in patches] == [
            ("/crm/v3/objects/contacts/101", 429), ("/crm/v3/objects/contacts/101", 200)]
        assert not any(r.path.endswith((V8_SUFFIX, "/v9")) for r in sl.sim.requests)
        command = await store.command_get(str(intent["command_id"]))
        rev7 = await store.catalog_get(REVISION)
        assert command is not None and rev7 is not None
        assert (command.catalog_revision, command.catalog_digest) == (REVISION, rev7.digest)


async def test_admission_validates_against_the_named_published_revision(
        database: FreshDatabase, store: WorkStore) -> None:
    async with running_slice(store, database.url, served_documents=_revision_8()) as sl:
        await sl.lead("lead-2", "102")
        # Revision 7 does not allow "email", whatever revision 8 (served now) allows.
        status, doc = await _post(sl, _body("int-a", "lead-2", REVISION,
                                            {"jobtitle": "CFO", "email": "x@example.com"}))
        assert (status, doc["error"]) == (422, "invalid_request")
        assert "fields not allowed by the operation: email" in doc["message"]
        # An unpublished revision: a stable code, nothing written.
        status, doc = await _post(sl, _body("int-b", "lead-2", 9, {"jobtitle": "CFO"}))
        assert (status, doc["error"]) == (409, "catalog_revision_not_published")
        assert doc["message"] == "catalog revision 9 is not published"
        assert await store.work_list(WorkQuery(family="external_effect")) == []
        # The replica serves several revisions: a command naming 8 runs under 8.
        status, doc = await _post(sl, _body("int-c", "lead-2", REVISION + 1,
                                            {"jobtitle": "CFO", "email": "y@example.com"}))
        assert status == 200, doc
        command = await store.command_get(doc["command_id"])
        rev8 = await store.catalog_get(REVISION + 1)
        assert command is not None and rev8 is not None
        assert (command.catalog_revision, command.catalog_digest) == (REVISION + 1,
                                                                      rev8.digest)
        await wait_for(lambda: any(r.method == "PATCH" for r in sl.sim.requests), within_s=30)
        (patch,) = [r for r in sl.sim.requests if r.method == "PATCH"]
        assert patch.path == "/crm/v3/objects/contacts/102" + V8_SUFFIX


async def test_a_command_whose_pinned_content_is_not_stored_is_refused_before_dispatch(
        database: FreshDatabase, store: WorkStore) -> None:
    """A delete racing an admission (admission reads the revision without a lock) can
    leave a command pinned to content that is not stored: it never runs under other
    definitions, and the operator sees why."""
    async with running_slice(store, database.url) as sl:
        await sl.lead("lead-3", "103")
        pinned_elsewhere = attrs.evolve(draft("int-e", scope=SCOPE, lead="lead-3"),
                                        catalog_revision=REVISION,
                                        catalog_digest="sha256:" + "e" * 64)
        result = await store.command_accept(pinned_elsewhere, WallClock().now_us())
        assert result.work_id is not None and result.command_id is not None
        sl.replica.wake("external_effect")  # type: ignore[union-attr]

        async def settled() -> bool:
            item = await store.work_get(str(result.work_id))
            return item is not None and item.state.value == "succeeded"

        # Nothing ever reached the provider: a proven no-effect settlement, which
        # completes the item with the refusal recorded (the DLQ is for operators).
        await wait_for(settled, within_s=30)
        item = await store.work_get(result.work_id)
        assert item is not None and item.failure_class == "catalog_revision_unavailable"
        assert item.operator_summary is not None
        assert f"pinned Catalog revision {REVISION}" in item.operator_summary
        assert sl.patches("103") == []
        command = await store.command_get(result.command_id)
        assert command is not None and command.settlement is Settlement.NO_EFFECT


async def test_replay_and_repair_resolve_the_current_revision_and_record_both(
        database: FreshDatabase, store: WorkStore) -> None:
    from tests.e2e.test_effect_console import closing, signed_in
    from tests.ui.support import _OPERATORS

    async with running_slice(store, database.url, max_attempts=2, operators=_OPERATORS,
                             served_documents=_revision_8()) as sl:
        await sl.unknown_dead_effect()  # a command pinned to 7, dead, outcome unknown
        (attempt,) = await store.effect_unknown_list()
        (dead,) = await store.work_list(WorkQuery(family="external_effect"))
        rev7, rev8 = await store.catalog_get(REVISION), await store.catalog_get(REVISION + 1)
        assert rev7 is not None and rev8 is not None
        otto, csrf = await signed_in(sl, "otto")
        headers = {"X-CSRF-Token": csrf}
        async with closing(otto):
            r = await otto.post(f"/admin/api/effects/attempts/{attempt.attempt_id}/disposition",
                                json={"disposition": "absent", "note": "not in HubSpot"},
                                headers=headers)
            assert r.status_code == 200, r.text
            # A replay runs the same command, pinned to 7, while 8 is current: refused.
            r = await otto.post(f"/admin/api/work/{dead.work_id}/replay",
                                json={"reason": "again"}, headers=headers)
            assert r.status_code == 409
            message = r.json()["message"]
            # (Absence is proven: the one action that settles at once is a retire, with
            # the no-effect result; a repair, pinned to revision 8, is allowed too.)
            assert "(pins_moved)" in message and "Instead: retire." in message
            assert (f"the command is pinned to Catalog revision {REVISION}; the current one"
                    f" is {REVISION + 1}" in message)
            r = await otto.post(f"/admin/api/effects/commands/{dead.subject_id}/repair",
                                json={"reason": "send it under the current revision"},
                                headers=headers)
            assert r.status_code == 200, r.text
            new_id = r.json()["command_id"]
        new = await store.command_get(new_id)
        assert new is not None and new.repair_of == dead.subject_id
        assert (new.catalog_revision, new.catalog_digest) == (REVISION + 1, rev8.digest)
        (entry,) = [e for e in await store.audit_list(target_id=dead.subject_id)
                    if e.action == "command.repair"]
        assert json.loads(entry.before)["catalog_revision"] == REVISION
        assert json.loads(entry.before)["catalog_digest"] == rev7.digest
        assert json.loads(entry.after)["catalog_revision"] == REVISION + 1
        assert json.loads(entry.after)["catalog_digest"] == rev8.digest
