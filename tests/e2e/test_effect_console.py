"""The console's effect repairs over real HTTP: roles, CSRF, conflicts, audit, no secrets."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from storage.effect_values import Settlement
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import HUBSPOT_TOKEN, RESULTS_TOKEN, RUNTIME_TOKEN, Slice, running_slice
from tests.ui.support import _OPERATORS, PASSWORDS

pytestmark = pytest.mark.slow


@asynccontextmanager
async def closing(*clients: httpx.AsyncClient) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for client in clients:
            await client.aclose()


async def signed_in(sl: Slice, name: str) -> tuple[httpx.AsyncClient, str]:
    client = httpx.AsyncClient(base_url=sl.base_url, timeout=10)
    form = await client.get("/admin/sign-in")
    found = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert found is not None
    r = await client.post("/admin/sign-in", data={
        "name": name, "password": PASSWORDS[name], "csrf_token": found.group(1),
        "next": "/admin/"})
    assert r.status_code == 302, r.text
    doc = (await client.get("/admin/api/session")).json()
    return client, str(doc["csrf_token"])


@pytest.fixture
async def unknown(database: FreshDatabase, store: WorkStore) -> AsyncIterator[tuple[Slice, str]]:
    async with running_slice(store, database.url, max_attempts=2, operators=_OPERATORS) as sl:
        await sl.unknown_dead_effect()
        (attempt,) = await store.effect_unknown_list()
        yield sl, attempt.attempt_id


async def test_dispositions_need_a_role_and_csrf_and_happen_once(
    unknown: tuple[Slice, str], store: WorkStore
) -> None:
    sl, attempt_id = unknown
    path = f"/admin/api/effects/attempts/{attempt_id}/disposition"
    body = {"disposition": "applied", "note": "HubSpot shows jobtitle CTO set by us"}
    anonymous = httpx.AsyncClient(base_url=sl.base_url)
    viewer, viewer_csrf = await signed_in(sl, "viv")
    otto, csrf = await signed_in(sl, "otto")
    async with closing(anonymous, viewer, otto):
        assert (await anonymous.post(path, json=body)).status_code == 401
        r = await viewer.post(path, json=body, headers={"X-CSRF-Token": viewer_csrf})
        assert r.status_code == 403
        r = await otto.post(path, json=body)  # no CSRF token
        assert r.status_code == 403
        assert await store.effect_unknown_backlog() == 1  # nothing changed
        r = await otto.post(path, json={"disposition": "maybe", "note": "x"},
                            headers={"X-CSRF-Token": csrf})
        assert (r.status_code, r.json()["error"]) == (400, "bad_request")
        r = await otto.post(path, json=body, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200, r.text
        assert r.json()["attempt"]["disposition"] == "operator_applied"
        again = await otto.post(path, json=body, headers={"X-CSRF-Token": csrf})
        assert again.status_code == 409
        listed = (await otto.get("/admin/api/effects/unknown")).json()
        assert listed["attempts"] == []
        assert listed["counts"] == {"outcome_unknown": 0, "no_outcome": 0}
        # Each count stops at a cap (issue 23) and says whether there are more.
        assert listed["more"] == {"outcome_unknown": False, "no_outcome": False}
        assert listed["counted_up_to"] == 1000
        # Nothing secret anywhere on the pages an operator can read.
        pages = [await otto.get(p) for p in (
            "/admin/effects", f"/admin/effects/attempts/{attempt_id}", "/admin/bindings")]
        for page in pages:
            assert page.status_code == 200
            for secret in (HUBSPOT_TOKEN, RUNTIME_TOKEN, RESULTS_TOKEN):
                assert secret not in page.text
    assert [e.action for e in await store.audit_list(target_id=attempt_id)] == [
        "effect.disposition"]


async def test_no_intent_is_stranded_after_an_applied_disposition(
    unknown: tuple[Slice, str], store: WorkStore
) -> None:
    """Issue 20 item 3, from outside: a PATCH applied, its read-back failed, the item
    dead; the operator records ``applied``. The console advises retire (never a refused
    action), a replay and a repair are refused naming it, the retire settles the exact
    success receipt and the Runtime intent is released; nothing is left to advise."""
    sl, attempt_id = unknown
    (dead,) = await store.work_list(WorkQuery(family="external_effect"))
    command_id = dead.subject_id
    otto, csrf = await signed_in(sl, "otto")
    headers = {"X-CSRF-Token": csrf}
    async with closing(otto):
        r = await otto.post(f"/admin/api/work/{dead.work_id}/replay",
                            json={"reason": "again"}, headers=headers)
        assert r.status_code == 409 and "outcome is unknown" in r.json()["message"]
        r = await otto.post(f"/admin/api/effects/attempts/{attempt_id}/disposition",
                            json={"disposition": "applied", "note": "seen in HubSpot"},
                            headers=headers)
        assert r.status_code == 200
        doc = (await otto.get(f"/admin/api/effects/commands/{command_id}")).json()
        assert doc["runtime_intent"]["effect_state"] == "applied"
        assert doc["runtime_intent"]["next_action"] == "retire"
        page = await otto.get(f"/admin/work/{dead.work_id}")
        assert "retire: settles the proven success" in page.text
        for path, body in ((f"/admin/api/work/{dead.work_id}/replay", {"reason": "settle"}),
                           (f"/admin/api/effects/commands/{command_id}/repair",
                            {"reason": "settle"})):
            r = await otto.post(path, json=body, headers=headers)
            assert r.status_code == 409, r.text
            assert "(proven_applied)" in r.json()["message"]
            assert "Instead: retire." in r.json()["message"]
        r = await otto.post(f"/admin/api/effects/commands/{command_id}/retire",
                            json={"reason": "applied, seen in HubSpot"}, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["settlement"] == "succeeded"
        receipt = await store.receipt_get(command_id)
        assert receipt is not None and (receipt.result_format_version,
                                        receipt.remote_id) == (1, "101")
        command = await store.command_get(command_id)
        assert command is not None
        await sl.wait_intent("lead-1", command.intent_id, "COMMITTED", within_s=30)
        doc = (await otto.get(f"/admin/api/effects/commands/{command_id}")).json()
        assert doc["runtime_intent"]["blocking"] is None
        assert doc["runtime_intent"]["next_action"] is None
        r = await otto.post(f"/admin/api/work/{dead.work_id}/replay",
                            json={"reason": "again"}, headers=headers)
        assert r.status_code == 409 and "(settled)" in r.json()["message"]
    assert command.settlement is Settlement.SUCCEEDED
    # Settled from the operator's evidence: no second PATCH was sent.
    assert len(sl.patches("101")) == 1


async def test_retire_and_repair_commands(unknown: tuple[Slice, str], store: WorkStore) -> None:
    sl, attempt_id = unknown
    (dead,) = await store.work_list(WorkQuery(family="external_effect"))
    command_id = dead.subject_id
    otto, csrf = await signed_in(sl, "otto")
    headers = {"X-CSRF-Token": csrf}
    async with closing(otto):
        r = await otto.post(f"/admin/api/effects/commands/{command_id}/retire",
                            json={"reason": "give up"}, headers=headers)
        assert r.status_code == 409 and "record a disposition" in r.json()["message"]
        await otto.post(f"/admin/api/effects/attempts/{attempt_id}/disposition",
                        json={"disposition": "absent", "note": "not in HubSpot history"},
                        headers=headers)
        r = await otto.post(f"/admin/api/effects/commands/{command_id}/repair",
                            json={"reason": "send it again under a new command"},
                            headers=headers)
        assert r.status_code == 200, r.text
        new_command = r.json()["command_id"]
        doc = (await otto.get(f"/admin/api/effects/commands/{command_id}")).json()
        assert doc["command"]["settlement"] == "retired"
        assert "frozen_request" not in doc["command"]

        async def repaired() -> bool:
            got = await store.command_get(new_command)
            return got is not None and got.settlement is Settlement.SUCCEEDED

        await wait_for(repaired, within_s=30)
        fresh = await store.command_get(new_command)
        assert fresh is not None and fresh.repair_of == command_id
        # The repair's success is the original intent's receipt, bound to the
        # command the Runtime accepted: the Runtime intent is released.
        assert await store.receipt_get(new_command) is None
        receipt = await store.receipt_get(command_id)
        assert receipt is not None and receipt.remote_id == "101"
        original = await store.command_get(command_id)
        assert original is not None
        await sl.wait_intent("lead-1", original.intent_id, "COMMITTED", within_s=30)
        doc = (await otto.get(f"/admin/api/effects/commands/{command_id}")).json()
        assert {k: doc["runtime_intent"][k] for k in (
            "answered_by_lineage_of", "repaired_by", "blocking", "next_action")} == {
            "answered_by_lineage_of": command_id, "repaired_by": new_command,
            "blocking": None, "next_action": None}
        # At most one repair per command.
        r = await otto.post(f"/admin/api/effects/commands/{command_id}/repair",
                            json={"reason": "twice"}, headers=headers)
        assert r.status_code == 409 and "(repaired)" in r.json()["message"]
    actions = [e.action for e in await store.audit_list(target_id=command_id)]
    assert actions.count("command.repair") == 1
    # One PATCH was lost; the repair's one PATCH applied the Title.
    assert [p.applied for p in sl.patches("101")] == [False, True]


async def test_link_adoption_is_for_admins(unknown: tuple[Slice, str], store: WorkStore) -> None:
    sl, _ = unknown
    body = {"binding_id": "hubspot-main", "local_object": "lead", "local_id": "lead-9",
            "remote_object": "contact", "remote_id": "909", "reason": "found by hand"}
    otto, otto_csrf = await signed_in(sl, "otto")
    ada, ada_csrf = await signed_in(sl, "ada")
    async with closing(otto, ada):
        r = await otto.post("/admin/api/effects/links/adopt", json=body,
                            headers={"X-CSRF-Token": otto_csrf})
        assert r.status_code == 403
        r = await ada.post("/admin/api/effects/links/adopt", json=body,
                           headers={"X-CSRF-Token": ada_csrf})
        assert r.status_code == 200 and r.json()["state"] == "active"
        clash = {**body, "local_id": "lead-10"}
        r = await ada.post("/admin/api/effects/links/adopt", json=clash,
                           headers={"X-CSRF-Token": ada_csrf})
        assert r.status_code == 409
        r = await ada.post("/admin/api/effects/links/adopt", json={**body, "binding_id": "x"},
                           headers={"X-CSRF-Token": ada_csrf})
        assert r.status_code == 400
        spec = (await ada.get("/admin/api/openapi.json")).json()
        assert "/admin/api/effects/links/adopt" in spec["paths"]
