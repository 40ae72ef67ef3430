"""Per-user principals beside the shared one (seed 8; issue 9, item 1).

The Runtime connects one user's grant (``kind = per_user``) through ``/v1/``; a command
that names that user is admitted under the user's binding and generation, and dispatch
presents that user's token (the HubSpot simulator accepts only it: the shared binding has
no grant at all). A command naming a user with no binding is durably rejected with the
stable reason ``no_user_binding``, and nothing is queued for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.core.canonical import canonical_digest
from daemon.core.handoff import EffectHandoffKey
from daemon.core.token_bundle import TokenKey
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.e2e.test_effect_pins import _signed_in
from tests.support.backends import FreshDatabase
from tests.support.commands import command_doc
from tests.support.harness import wait_for
from tests.support.slice import RUNTIME_TOKEN, SCOPE, Slice, SliceGrant, running_slice
from tests.ui.support import _OPERATORS

pytestmark = pytest.mark.slow

KEY = TokenKey("k1", bytes(range(32)))
ADA_TOKEN = "access-SECRET-ada"
AUTH = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}


def _body(intent_id: str, user: str) -> dict[str, Any]:
    command = {**command_doc(intent_id, "CTO"), "user_id": user}
    return {"effect_handoff_key": EffectHandoffKey(SCOPE, intent_id).encode(),
            "payload_digest": canonical_digest(command), "runtime_outbox_id": f"ob-{intent_id}",
            "command": command}


async def _connect_ada(sl: Slice) -> None:
    r = await sl.http.post(f"{sl.api_url}/v1/bindings/ada-hubspot/connect", headers=AUTH,
                           json={"idempotency_key": "connect-ada", "kind": "per_user",
                                 "user_id": "ada", "provider": "hubspot",
                                 "identity": {"issuer": "https://auth.example",
                                              "remote_account_id": "portal-1",
                                              "remote_subject": "user-ada"},
                                 "grant": {"type": "oauth_code_exchange",
                                           "access_token": ADA_TOKEN, "expires_in": 3600}})
    assert r.status_code == 200, r.text
    assert (r.json()["kind"], r.json()["generation"]) == ("per_user", 1)


async def test_a_per_user_command_runs_under_that_users_grant(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    (tmp_path / "k1.key").write_text(KEY.material.hex())
    grant = SliceGrant(token_url="http://127.0.0.1:9/oauth/token", client_secret="unused",
                       key_dir=str(tmp_path), tokens={ADA_TOKEN})
    async with running_slice(store, database.url, grant=grant, operators=_OPERATORS) as sl:
        await sl.lead("lead-1", "101")
        await _connect_ada(sl)
        r = await sl.http.post(f"{sl.api_url}/v1/commands", headers=AUTH,
                               json=_body("int-ada-1", "ada"))
        assert r.status_code == 200, r.text
        command = await store.command_get(r.json()["command_id"])
        assert command is not None
        assert (command.binding_id, command.binding_generation) == ("ada-hubspot", 1)
        (item,) = await store.work_list(WorkQuery(family="external_effect"))

        async def settled() -> bool:
            got = await store.work_get(item.work_id)
            return got is not None and got.state.value == "succeeded"

        await wait_for(settled, within_s=30)
        # Only ada's token is valid at the provider: the PATCH applied, so it was hers.
        patches = [q for q in sl.sim.requests if q.method == "PATCH"]
        assert [(q.contact_id, q.applied) for q in patches] == [("101", True)]
        got = await store.work_get(item.work_id)
        assert got is not None and got.terminal_outcome == "succeeded"
        # The shared principal beside it has no grant: its command never borrows ada's.
        await sl.lead("lead-2", "102")
        shared = {**command_doc("int-shared-1", "CTO", lead="lead-2")}
        r = await sl.http.post(f"{sl.api_url}/v1/commands", headers=AUTH, json={
            "effect_handoff_key": EffectHandoffKey(SCOPE, "int-shared-1").encode(),
            "payload_digest": canonical_digest(shared), "runtime_outbox_id": "ob-shared",
            "command": shared})
        assert r.status_code == 200, r.text
        other = await store.command_get(r.json()["command_id"])
        assert other is not None and other.binding_id == "hubspot-main"
        items = await store.work_list(WorkQuery(family="external_effect"))
        (second,) = [i for i in items if i.subject_id == other.command_id]

        async def refused() -> bool:
            got = await store.work_get(second.work_id)
            return got is not None and got.state.value not in ("pending", "retry",
                                                               "processing")

        await wait_for(refused, within_s=30)
        got = await store.work_get(second.work_id)
        assert got is not None and got.failure_class == "no_grant", got
        assert [q for q in sl.sim.requests if q.contact_id == "102"
                and q.method == "PATCH"] == []
        # The console's bindings page: ada's binding beside the shared one, with its
        # generation, grant state, token version and history; never her token.
        client = await _signed_in(sl, "viv")
        try:
            page = (await client.get("/admin/bindings")).text
            api = (await client.get("/admin/api/bindings")).json()
        finally:
            await client.aclose()
        assert ADA_TOKEN not in page and ADA_TOKEN not in json.dumps(api)
        (ada,) = api["connected"]
        assert (ada["binding_id"], ada["durable"]["kind"], ada["durable"]["user_id"]) == (
            "ada-hubspot", "per_user", "ada")
        assert (ada["durable"]["generation"], ada["grant"]["state"],
                ada["grant"]["token_version"]) == (1, "valid", 1)
        (connected,) = ada["history"]
        assert (connected["actor"], connected["action"], connected["generation_after"]) == (
            "runtime:crm", "binding.connect", 1)
        assert "ada-hubspot" in page and "runtime:crm" in page and "binding.connect" in page


async def test_a_command_for_a_user_with_no_binding_is_durably_rejected(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    (tmp_path / "k1.key").write_text(KEY.material.hex())
    grant = SliceGrant(token_url="http://127.0.0.1:9/oauth/token", client_secret="unused",
                       key_dir=str(tmp_path), tokens={ADA_TOKEN})
    async with running_slice(store, database.url, grant=grant, with_replica=False) as sl:
        await _connect_ada(sl)  # ada has a binding; bob has none
        first = await sl.http.post(f"{sl.api_url}/v1/commands", headers=AUTH,
                                   json=_body("int-bob-1", "bob"))
        assert first.status_code == 409, first.text
        doc = first.json()
        assert (doc["admission"], doc["error"], doc["receipt"]["reason"]) == (
            "HANDOFF_REJECTED", "no_user_binding", "no_user_binding")
        # Durable: a retry, and a later read, see the same tombstone; nothing is queued.
        again = await sl.http.post(f"{sl.api_url}/v1/commands", headers=AUTH,
                                   json=_body("int-bob-1", "bob"))
        assert again.status_code == 409 and again.json()["receipt"] == doc["receipt"]
        read = await sl.http.get(f"{sl.api_url}/v1/handoffs", headers=AUTH, params={
            "effect_handoff_key": _body("int-bob-1", "bob")["effect_handoff_key"]})
        assert read.json()["admission"] == "HANDOFF_REJECTED"
        assert read.json()["receipt"]["reason"] == "no_user_binding"
        # In a batch too, entry by entry.
        batch = await sl.http.post(f"{sl.api_url}/v1/commands/batch", headers=AUTH, json={
            "commands": [_body("int-bob-2", "bob"), _body("int-ada-2", "ada")]})
        results = batch.json()["results"]
        assert [r["status"] for r in results] == [409, 200]
        assert results[0]["receipt"]["reason"] == "no_user_binding"
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        command = await store.command_get(item.subject_id)
        assert command is not None and command.binding_id == "ada-hubspot"
