"""Outbound Outreach PATCH from the Runtime's post-commit outbox (issue 10 items 7 and 11).

Real servers on loopback: the reference Runtime's outbox -> integrationd's /v1 admission ->
WorkItem -> one EffectAttempt -> JSON:API PATCH of the linked Prospect on the Outreach
simulator, under a one-hour S2S token minted through the single-winner lease -> terminal
receipt committed in the Runtime. Then the proofs of seed 13's Outreach list: "outbound
PATCH ambiguity and operator repair" and "reinstall/reconnect fencing".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.core.canonical import canonical_digest
from daemon.core.handoff import EffectHandoffKey
from daemon.core.principals import BindingEvent, BindingIdentity
from daemon.core.states import WorkState
from daemon.services.clock import WallClock
from sandbox.hubspot_sim import Fault
from storage.effect_values import ReceiptState, Settlement
from storage.grants import GrantState
from storage.port import WorkQuery
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.attempts import sent_attempts
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.outreach_slice import BINDING, INSTALL, OutreachSlice, running_outreach_slice
from tests.support.slice import REVISION, RUNTIME_TOKEN, SCOPE

pytestmark = pytest.mark.slow

MEDIA = "application/vnd.api+json"


async def _command(store: WorkStore, intent: dict[str, object]) -> str:
    command_id = intent["command_id"]
    assert isinstance(command_id, str)
    return command_id


async def _receipt_confirmed(store: WorkStore, command_id: str) -> bool:
    receipt = await store.receipt_get(command_id)
    return receipt is not None and receipt.state is ReceiptState.CONFIRMED


async def test_a_title_change_is_patched_with_a_minted_s2s_token_and_receipted(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path) as sl:
        await sl.lead("lead-1", 42)
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        # One PATCH of the linked Prospect, JSON:API, only the outbound-owned attribute.
        (patch,) = sl.patches(42)
        assert (patch.status, patch.applied) == (200, True)
        prospect = sl.sim.prospect(42)
        assert prospect is not None and prospect["attributes"]["title"] == "CTO"
        assert prospect["attributes"]["firstName"] == "Ada"  # a sparse PATCH
        # The token was minted once, for the binding's installation, and is the grant's
        # token version 2 (version 1 is the placeholder the first use minted over).
        assert [(e["install_id"], e["answer"]) for e in sl.s2s.journal] == [(INSTALL, "ok")]
        grant = await store.grant_get(BINDING, 1)
        assert grant is not None and (grant.token_version, grant.state) == (2,
                                                                            GrantState.VALID)
        # The Runtime holds the success receipt naming the Prospect.
        (receipt,) = (await sl.lead_doc("lead-1"))["receipts"]
        assert (receipt["result_format_version"], receipt["remote_id"]) == (1, "42")
        command_id = await _command(store, intent)
        command = await store.command_get(command_id)
        assert command is not None and command.settlement is Settlement.SUCCEEDED
        (attempt,) = sent_attempts(await store.effect_attempts(command_id))
        assert (attempt.outcome, attempt.method, attempt.target_path) == (
            "ACCEPTED", "PATCH", "/api/v2/prospects/42")
        assert json.loads(attempt.safe_headers)["Content-Type"] == MEDIA
        assert "Authorization" not in attempt.safe_headers
        assert json.loads(attempt.provider_evidence or "{}")["id"] == "42"
        # Sent on a slot of the Outreach quota key (the binding's), now "sent".
        (effect,) = await store.work_list(WorkQuery(family="external_effect"))
        (reservation,) = await store.quota_reservations(effect.work_id)
        assert (reservation.state.value, reservation.attempt_id) == ("sent",
                                                                     attempt.attempt_id)
        assert reservation.reservation_id in attempt.pre_dispatch_evidence
        assert reservation.quota_key.startswith("outreach:per_user_hour:")
        await wait_for(lambda: _receipt_confirmed(store, command_id), within_s=30)
        # No token or key in what the attempt keeps.
        for token in sl.s2s.access_tokens:
            assert token not in (attempt.safe_headers + (attempt.provider_evidence or ""))


async def test_a_revoked_token_is_minted_again_once_for_many_commands(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path) as sl:
        for n in range(3):
            await sl.lead(f"lead-{n}", 40 + n)
        first = await sl.set_title("lead-0", "A")
        await sl.wait_intent("lead-0", first, "COMMITTED")
        # (The first token was minted over the generation's expired placeholder.) Now
        # Outreach revokes it: the next PATCHes are 401s, one claimant mints again through
        # the lease, everyone uses version 3.
        sl.s2s.access_tokens.clear()
        ids = [(f"lead-{n}", await sl.set_title(f"lead-{n}", "B")) for n in range(3)]
        for lead, intent_id in ids:
            await sl.wait_intent(lead, intent_id, "COMMITTED")
        assert [e["answer"] for e in sl.s2s.journal] == ["ok", "ok"]
        grant = await store.grant_get(BINDING, 1)
        assert grant is not None and grant.token_version == 3
        statuses = [r.status for r in sl.sim.requests if r.method == "PATCH"]
        assert 401 in statuses and statuses.count(200) == 4
        for n in range(3):
            prospect = sl.sim.prospect(40 + n)
            assert prospect is not None and prospect["attributes"]["title"] == "B"


async def test_a_refused_app_jwt_settles_the_work_with_needs_reauthorization_once(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path,
                                      endpoint_app_id="another-app") as sl:
        await sl.lead("lead-1", 42)
        intent_id = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        (item,) = await store.work_list(WorkQuery(family="external_effect"))
        assert (item.terminal_outcome, item.failure_class) == ("no_effect",
                                                               "needs_reauthorization")
        # One call to the mint, none to the API; the grant waits for an operator.
        assert [str(e["answer"]).split(":")[0] for e in sl.s2s.journal] == ["invalid_jwt"]
        assert sl.patches(42) == []
        grant = await store.grant_get(BINDING, 1)
        assert grant is not None and grant.state is GrantState.NEEDS_REAUTHORIZATION
        (receipt,) = (await sl.lead_doc("lead-1"))["receipts"]
        assert receipt["result_format_version"] == 2  # a no-effect receipt


async def test_an_ambiguous_patch_is_reconciled_by_read_back_never_resent(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path) as sl:
        await sl.lead("lead-1", 42)
        # Outreach applies the PATCH, then the connection dies before the answer.
        sl.sim.inject(Fault(mode="reset_after", method="PATCH", path_prefix="/api/v2/"))
        intent_id = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", intent_id, "COMMITTED")
        assert [(p.status, p.applied) for p in sl.patches(42)] == [(None, True)]
        attempts = sent_attempts(await store.effect_attempts(await _command(store, intent)))
        assert [(a.outcome, a.disposition) for a in attempts] == [
            ("OUTCOME_UNKNOWN", "proven_applied")]
        # The read-back (a GET with the same S2S token) proved it: one receipt.
        gets = [r for r in sl.sim.requests if r.method == "GET"]
        assert gets and all(r.status == 200 for r in gets)
        (receipt,) = (await sl.lead_doc("lead-1"))["receipts"]
        assert (receipt["result_format_version"], receipt["remote_id"]) == (1, "42")


async def _dead_unknown(sl: OutreachSlice, store: WorkStore) -> str:
    """A PATCH lost mid-flight, then a user edits the Prospect's title in Outreach: the
    read-back shows neither our value nor an untouched record. Returns the dead item."""
    await sl.lead("lead-1", 42)
    sl.sim.inject(Fault(mode="reset_before", method="PATCH", path_prefix="/api/v2/"))
    await sl.set_title("lead-1", "CTO")
    await wait_for(lambda: bool(sl.patches(42)), within_s=30)
    sl.sim.update_prospect(42, {"title": "Changed in Outreach by someone else"},
                           notify=False)

    async def dead() -> bool:
        items = await store.work_list(WorkQuery(family="external_effect"))
        return bool(items) and items[0].state is WorkState.DEAD

    await wait_for(dead, within_s=60)
    (item,) = await store.work_list(WorkQuery(family="external_effect"))
    return item.work_id


async def test_a_patch_read_back_cannot_settle_is_repaired_by_an_operator_once(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    from tests.e2e.test_effect_console import closing, signed_in
    from tests.ui.support import _OPERATORS

    async with running_outreach_slice(store, database.url, tmp_path, max_attempts=2,
                                      operators=_OPERATORS) as sl:
        work_id = await _dead_unknown(sl, store)
        (attempt,) = await store.effect_unknown_list()
        assert attempt.outcome == "OUTCOME_UNKNOWN"
        dead = await store.work_get(work_id)
        assert dead is not None
        command_id = dead.subject_id
        original = await store.command_get(command_id)
        assert original is not None and original.settlement is Settlement.OPEN
        # Nothing reached the Runtime yet: its intent is still outstanding.
        assert (await sl.intent("lead-1", original.intent_id))["status"] != "COMMITTED"
        otto, csrf = await signed_in(sl, "otto")  # type: ignore[arg-type]
        headers = {"X-CSRF-Token": csrf}
        async with closing(otto):
            r = await otto.post(f"/admin/api/effects/attempts/{attempt.attempt_id}/"
                                "disposition", headers=headers,
                                json={"disposition": "absent",
                                      "note": "Outreach's audit log shows no change by us"})
            assert r.status_code == 200, r.text
            r = await otto.post(f"/admin/api/effects/commands/{command_id}/repair",
                                json={"reason": "send the Title again"}, headers=headers)
            assert r.status_code == 200, r.text
            repair = r.json()["command_id"]

            async def repaired() -> bool:
                got = await store.command_get(repair)
                return got is not None and got.settlement is Settlement.SUCCEEDED

            await wait_for(repaired, within_s=30)
        # Exactly one true terminal receipt reaches the Runtime, for the original intent.
        await sl.wait_intent("lead-1", original.intent_id, "COMMITTED", within_s=30)
        (receipt,) = (await sl.lead_doc("lead-1"))["receipts"]
        assert (receipt["result_format_version"], receipt["remote_id"]) == (1, "42")
        assert [p.applied for p in sl.patches(42)] == [False, True]
        prospect = sl.sim.prospect(42)
        assert prospect is not None and prospect["attributes"]["title"] == "CTO"
        actions = [e.action for e in await store.audit_list(target_id=command_id)]
        assert actions.count("command.repair") == 1


async def test_a_reinstall_between_enqueue_and_dispatch_fails_the_queued_work_closed(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    new_install = "install-43"
    async with running_outreach_slice(store, database.url, tmp_path,
                                      installs=(INSTALL, new_install)) as sl:
        await sl.lead("lead-1", 42)
        warm = await sl.set_title("lead-1", "Warm")  # mints installation 42's token
        await sl.wait_intent("lead-1", warm, "COMMITTED")
        # No replica claims work for a while; the next change is admitted and queued,
        # pinned to binding generation 1 (installation 42), with a cached valid token.
        await sl.stop_replica()
        queued = await sl.set_title("lead-1", "CTO")
        intent = await sl.wait_intent("lead-1", queued, "ACCEPTED")
        command_id = await _command(store, intent)
        command = await store.command_get(command_id)
        assert command is not None and command.binding_generation == 1
        # The app is reinstalled in Outreach: a new installation id, the old one's tokens
        # revoked. The operator records it; the binding moves to generation 2.
        sl.s2s.installs.discard(INSTALL)
        sl.s2s.access_tokens.clear()
        facts = await store.binding_get(BINDING)
        assert facts is not None and facts.identity.installation_id == INSTALL
        await store.binding_transition(
            BINDING, BindingEvent.CHANGE, Actor("otto", "admin", "Outreach app reinstalled"),
            expected_generation=1, now_us=WallClock().now_us(),
            identity=BindingIdentity(issuer=facts.identity.issuer,
                                     remote_account_id=facts.identity.remote_account_id,
                                     remote_subject=facts.identity.remote_subject,
                                     installation_id=new_install))
        patches_before, mints_before = len(sl.patches(42)), len(sl.s2s.journal)
        await sl.start_replica()
        # The queued work fails closed: settled no-effect (nothing was ever sent), the
        # Runtime gets that terminal receipt, the operator sees why.
        intent = await sl.wait_intent("lead-1", queued, "COMMITTED")
        (item,) = [i for i in await store.work_list(WorkQuery(family="external_effect"))
                   if i.subject_id == command_id]
        assert (item.state, item.terminal_outcome, item.failure_class) == (
            WorkState.SUCCEEDED, "no_effect", "binding_generation")
        assert "generation" in (item.operator_summary or "")
        receipts = (await sl.lead_doc("lead-1"))["receipts"]
        assert [r["result_format_version"] for r in receipts] == [1, 2]
        assert await store.effect_attempts(command_id) == []
        # Outreach received nothing for it, under either installation's token.
        assert len(sl.patches(42)) == patches_before
        assert len(sl.s2s.journal) == mints_before
        prospect = sl.sim.prospect(42)
        assert prospect is not None and prospect["attributes"]["title"] == "Warm"
        # New work pins generation 2 and is sent under the new installation's token.
        after = await sl.set_title("lead-1", "CEO")
        await sl.wait_intent("lead-1", after, "COMMITTED")
        assert [(e["install_id"], e["answer"]) for e in sl.s2s.journal[mints_before:]] == [
            (new_install, "ok")]
        assert sl.patches(42)[-1].status == 200
        assert set(sl.s2s.token_installs[t] for t in sl.s2s.access_tokens) == {new_install}
        prospect = sl.sim.prospect(42)
        assert prospect is not None and prospect["attributes"]["title"] == "CEO"


def _command_doc(intent_id: str, attributes: dict[str, str]) -> dict[str, object]:
    doc = {"intent_id": intent_id, "intent_kind": "UPSERT",
           "operation": "outreach.prospect.update",
           "logical_target": {"object": "lead", "lead_id": "lead-1"},
           "catalog_revision": REVISION, "request": {"attributes": attributes}}
    return {"effect_handoff_key": EffectHandoffKey(SCOPE, intent_id).encode(),
            "payload_digest": canonical_digest(doc), "runtime_outbox_id": f"ob-{intent_id}",
            "command": doc}


async def test_a_command_patching_an_inbound_owned_field_is_rejected_for_good(
        database: FreshDatabase, store: WorkStore, tmp_path: Path) -> None:
    async with running_outreach_slice(store, database.url, tmp_path) as sl:
        await sl.lead("lead-1", 42)
        api = sl.settings.api.listen
        auth = {"Authorization": f"Bearer {RUNTIME_TOKEN}"}
        # firstName is L1-writable but inbound-owned (config/bindings/outreach_lead.toml):
        # refused for good, with a stable reason, and recorded as the key's admission fact.
        body = _command_doc("int-owned-1", {"title": "CTO", "firstName": "Eve"})
        for _ in range(2):  # the same answer on a retry: the tombstone is durable
            r = await sl.http.post(f"http://{api}/v1/commands", json=body, headers=auth)
            assert r.status_code == 409, r.text
            doc = r.json()
            assert doc["admission"] == "HANDOFF_REJECTED"
            assert doc["receipt"]["reason"] == "inbound_owned_field"
        read = await sl.http.get(f"http://{api}/v1/handoffs", headers=auth,
                                 params={"effect_handoff_key": str(body["effect_handoff_key"])})
        assert (read.status_code, read.json()["admission"]) == (200, "HANDOFF_REJECTED")
        assert read.json()["receipt"]["reason"] == "inbound_owned_field"
        # In a batch: the refused entry is answered on its own, the valid one accepted.
        batch = await sl.http.post(f"http://{api}/v1/commands/batch", headers=auth, json={
            "commands": [_command_doc("int-owned-2", {"lastName": "X"}),
                         _command_doc("int-owned-3", {"title": "VP"})]})
        refused, accepted = batch.json()["results"]
        assert (refused["status"], refused["receipt"]["reason"]) == (409,
                                                                     "inbound_owned_field")
        assert (accepted["status"], accepted["admission"]) == (200, "COMMAND_ACCEPTED")

        async def patched() -> bool:
            return bool(sl.patches(42))

        await wait_for(patched, within_s=30)
        # Only the outbound-owned command reached Outreach; nothing else was written.
        (only,) = await store.work_list(WorkQuery(family="external_effect"))
        assert only.subject_id == accepted["command_id"]
        await wait_for(lambda: _settled(store, accepted["command_id"]), within_s=30)
        prospect = sl.sim.prospect(42)
        assert prospect is not None
        assert (prospect["attributes"]["title"], prospect["attributes"]["firstName"],
                prospect["attributes"].get("lastName")) == ("VP", "Ada", None)
        # The console's admission metric counts the rejections.
        assert sl.replica is not None
        metrics = sl.replica.metrics_text().decode()
        assert ('integrationd_command_admissions_total{request="command",result="rejected"}'
                ' 2.0') in metrics
        assert ('integrationd_command_admissions_total{request="command",'
                'result="already_rejected"} 1.0') in metrics


async def _settled(store: WorkStore, command_id: str) -> bool:
    command = await store.command_get(command_id)
    return command is not None and command.settlement is Settlement.SUCCEEDED
