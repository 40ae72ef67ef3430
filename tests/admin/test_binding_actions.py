"""The console's binding transitions: disconnect stops dispatch under a binding and keeps
its generation; reconnect moves the generation; change_issuer, rebind, change_scopes and
reinstall move it as the connect-flow table says (a narrowing keeps it). Each needs an
operator, the CSRF token, a reason and the generation the operator saw (a
compare-and-swap); a refusal writes nothing; each transition is audited with the
operator's reason and the facts before and after. A grant that needs re-authorization
says why on the page and in the JSON API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest

from config.settings import BindingSettings
from daemon.core.grant_reasons import grant_reason
from daemon.core.principals import (
    BindingEvent,
    BindingIdentity,
    BindingState,
    PrincipalKind,
    connect,
)
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from storage.grants import GrantState
from storage.port import AuditEntry
from storage.principals import Actor, facts_json
from storage.work_store import WorkStore
from tests.admin.support import ConsoleHarness, console_harness, console_settings
from tests.support.backends import FreshDatabase
from tests.support.work import T0

BINDING = BindingSettings(binding_id="crm-main", provider="hubspot", org_id="org-1",
                          app_installation_id="app-1", remote_account_id="acct-1",
                          base_url="http://127.0.0.1:9")
FACTS = connect(binding_id="crm-main", kind=PrincipalKind.SHARED, org_id="org-1",
                app_installation_id="app-1", provider="hubspot",
                identity=BindingIdentity(issuer="https://issuer.test",
                                         remote_account_id="acct-1", remote_subject="app",
                                         scopes=("read", "write")))


@pytest.fixture
async def bound(database: FreshDatabase) -> AsyncIterator[ConsoleHarness]:
    """The console over a fresh database of each backend, one binding connected."""
    settings = attrs.evolve(console_settings(), bindings=(BINDING,))
    async with console_harness(database, settings=settings) as harness:
        await harness.store.binding_connect(FACTS, Actor("setup", "admin", "test"), T0)
        yield harness


def _form(csrf: str, generation: object = 1, reason: str | None = "token leaked",
          **fields: str) -> dict[str, str]:
    form = {"csrf_token": csrf, "generation": str(generation), **fields}
    if reason is not None:
        form["reason"] = reason
    return form


async def test_disconnect_and_reconnect_move_the_binding_as_the_cli_does(
        bound: ConsoleHarness) -> None:
    operator, csrf = await bound.sign_in("otto")
    page = await (await operator.get("/admin/bindings")).get_data(as_text=True)
    assert 'id="disconnect-crm-main"' in page and 'id="reconnect-crm-main"' not in page
    done = await operator.post("/admin/bindings/crm-main/disconnect", form=_form(csrf))
    assert done.status_code == 302
    assert done.headers["Location"].endswith("notice=binding_disconnect")
    after = await bound.store.binding_get("crm-main")
    assert after is not None and (after.state, after.generation) == (
        BindingState.DISCONNECTED, 1)
    page = await (await operator.get("/admin/bindings?notice=binding_disconnect")
                  ).get_data(as_text=True)
    assert 'id="reconnect-crm-main"' in page and "Disconnected:" in page
    again = await operator.post("/admin/bindings/crm-main/reconnect", form=_form(csrf))
    assert again.status_code == 302
    after = await bound.store.binding_get("crm-main")
    assert after is not None and (after.state, after.generation) == (
        BindingState.CONNECTED, 2)
    assert after.identity == FACTS.identity
    entries = [(e.action, e.actor, e.role, e.reason) for e in await bound.store.audit_list()
               if e.target_id == "crm-main" and e.actor == "otto"]
    assert sorted(entries) == [("binding.disconnect", "otto", "operator", "token leaked"),
                               ("binding.reconnect", "otto", "operator", "token leaked")]


async def test_refusals_write_nothing_and_say_why(bound: ConsoleHarness) -> None:
    viewer, viewer_csrf = await bound.sign_in("viv")
    assert (await viewer.post("/admin/bindings/crm-main/disconnect",
                              form=_form(viewer_csrf))).status_code == 403
    page = await (await viewer.get("/admin/bindings")).get_data(as_text=True)
    assert 'id="disconnect-crm-main"' not in page  # no form for a viewer
    operator, csrf = await bound.sign_in("otto")
    no_csrf = {k: v for k, v in _form(csrf).items() if k != "csrf_token"}
    assert (await operator.post("/admin/bindings/crm-main/disconnect",
                                form=no_csrf)).status_code == 403
    cases = [
        ("disconnect", _form(csrf, reason=None), 400, "a reason is required"),
        ("disconnect", _form(csrf, generation="one"), 400, "generation you saw"),
        ("disconnect", _form(csrf, generation=0), 400, "generation you saw"),
        ("disconnect", _form(csrf, generation=2), 409, "at generation 1, not 2"),
        ("reconnect", _form(csrf), 409, "not_disconnected"),
        ("change", _form(csrf), 404, "no console action"),
    ]
    for verb, form, status, says in cases:
        got = await operator.post(f"/admin/bindings/crm-main/{verb}", form=form)
        text = await got.get_data(as_text=True)
        assert (got.status_code, says in text) == (status, True), (verb, form, text[-400:])
    unknown = await operator.post("/admin/bindings/nope/disconnect", form=_form(csrf))
    assert unknown.status_code == 409 and "no binding nope" in await unknown.get_data(
        as_text=True)
    after = await bound.store.binding_get("crm-main")
    assert after == FACTS
    assert [e for e in await bound.store.audit_list() if e.actor == "otto"] == []


async def test_the_bindings_page_shows_the_durable_account_and_the_drift(
        bound: ConsoleHarness) -> None:
    viewer, _ = await bound.sign_in("viv")
    doc = (await (await viewer.get("/admin/api/bindings")).get_json())["items"][0]
    assert (doc["durable"]["remote_account_id"], doc["drift"]) == ("acct-1", [])
    # A rebind (the audited transition); the TOML still names acct-1.
    await bound.store.binding_transition(
        "crm-main", BindingEvent.CHANGE, Actor("ada", "admin", "the org moved"),
        expected_generation=1, now_us=T0,
        identity=attrs.evolve(FACTS.identity, remote_account_id="acct-2"))
    doc = (await (await viewer.get("/admin/api/bindings")).get_json())["items"][0]
    assert doc["durable"]["remote_account_id"] == "acct-2"
    assert doc["drift"] == [
        {"field": "generation", "configured": "1", "durable": "2"},
        {"field": "remote_account_id", "configured": "acct-1", "durable": "acct-2"}]
    page = await (await viewer.get("/admin/bindings")).get_data(as_text=True)
    assert "remote_account_id: the configuration says acct-1 (the durable acct-2 decides)" in (
        page)
async def _mine(store: WorkStore, actor: str) -> list[AuditEntry]:
    return sorted((e for e in await store.audit_list()
                   if e.target_id == "crm-main" and e.actor == actor), key=lambda e: e.at_us)


async def test_identity_flows_move_the_generation_as_the_flow_table_says(
        bound: ConsoleHarness) -> None:
    operator, csrf = await bound.sign_in("otto")
    page = await (await operator.get("/admin/bindings")).get_data(as_text=True)
    for flow in ("change_issuer", "rebind", "change_scopes", "reinstall"):
        assert f'id="{flow}-crm-main"' in page, flow
    steps: list[tuple[str, dict[str, str], int, str, dict[str, Any]]] = [
        # (flow, form fields, generation after, notice, identity after (changed fields))
        ("change_issuer", {"issuer": "https://other.test", "remote_subject": "app"}, 2,
         "binding_change_issuer", {"issuer": "https://other.test"}),
        ("rebind", {"remote_account_id": "acct-2", "remote_subject": "app-2"}, 3,
         "binding_rebind", {"remote_account_id": "acct-2", "remote_subject": "app-2"}),
        ("change_scopes", {"scopes": "read, write admin"}, 4, "binding_change_scopes",
         {"scopes": ("admin", "read", "write")}),
        # Only narrowing: the generation (and its grant) is kept.
        ("change_scopes", {"scopes": "read"}, 4, "binding_generation_kept",
         {"scopes": ("read",)}),
        ("reinstall", {"installation_id": "inst-9"}, 5, "binding_reinstall",
         {"installation_id": "inst-9"}),
        # An uninstall and install of the same id is a new authorization all the same.
        ("reinstall", {"installation_id": ""}, 6, "binding_reinstall", {}),
    ]
    identity = FACTS.identity
    for flow, fields, generation, notice, changed in steps:
        before = await bound.store.binding_get("crm-main")
        assert before is not None
        done = await operator.post(f"/admin/bindings/crm-main/{flow}",
                                   form=_form(csrf, before.generation, **fields))
        assert done.status_code == 302, await done.get_data(as_text=True)
        assert done.headers["Location"].endswith(f"notice={notice}")
        identity = attrs.evolve(identity, **changed)
        after = await bound.store.binding_get("crm-main")
        assert after is not None
        assert (after.generation, after.state, after.identity) == (
            generation, BindingState.CONNECTED, identity), flow
        entry = (await _mine(bound.store, "otto"))[-1]
        assert (entry.action, entry.role, entry.reason) == (
            f"binding.{flow}", "operator", "token leaked")
        assert json.loads(entry.before)["generation"] == before.generation
        assert json.loads(entry.after) == {**json.loads(facts_json(after)), "flow": flow}
    page = await (await operator.get("/admin/bindings?notice=binding_reinstall")
                  ).get_data(as_text=True)
    assert "Reinstalled: the binding moved to a new generation" in page
    assert "binding.reinstall" in page and "5 &rarr; 6" in page
    assert len(await _mine(bound.store, "otto")) == 6
    # An admin may too.
    admin, admin_csrf = await bound.sign_in("ada")
    done = await admin.post("/admin/bindings/crm-main/change_issuer",
                            form=_form(admin_csrf, 6, issuer="https://third.test"))
    assert done.status_code == 302
    after = await bound.store.binding_get("crm-main")
    assert after is not None and (after.generation, after.identity.issuer) == (
        7, "https://third.test")


async def test_identity_flow_refusals_write_nothing_and_say_why(
        bound: ConsoleHarness) -> None:
    viewer, viewer_csrf = await bound.sign_in("viv")
    got = await viewer.post("/admin/bindings/crm-main/change_issuer",
                            form=_form(viewer_csrf, issuer="https://evil.test"))
    assert got.status_code == 403
    page = await (await viewer.get("/admin/bindings")).get_data(as_text=True)
    assert 'id="change_issuer-crm-main"' not in page
    operator, csrf = await bound.sign_in("otto")
    no_csrf = {k: v for k, v in _form(csrf, issuer="https://x.test").items()
               if k != "csrf_token"}
    assert (await operator.post("/admin/bindings/crm-main/change_issuer",
                                form=no_csrf)).status_code == 403
    cases = [
        ("change_issuer", _form(csrf, reason=None, issuer="https://x.test"), 400,
         "a reason is required"),
        ("change_issuer", _form(csrf, generation="x", issuer="https://x.test"), 400,
         "generation you saw"),
        ("change_issuer", _form(csrf, generation=2, issuer="https://x.test"), 409,
         "stale_generation: binding crm-main is at generation 1, not 2"),
        ("change_issuer", _form(csrf), 400, "invalid_input: change_issuer names the new"),
        ("change_issuer", _form(csrf, issuer="https://x.test", remote_account_id="acct-9"),
         400, "field_not_allowed: change_issuer may not change remote_account_id"),
        ("rebind", _form(csrf, issuer="https://x.test"), 400,
         "field_not_allowed: rebind may not change issuer"),
        ("rebind", _form(csrf, remote_account_id="acct 9"), 400,
         "invalid_input: remote_account_id must be"),
        ("rebind", _form(csrf, remote_account_id="a" * 256), 400,
         "invalid_input: remote_account_id must be"),
        ("change_scopes", _form(csrf, scopes=" , "), 400,
         "invalid_input: name at least one scope"),
        ("change_scopes", _form(csrf, scopes=" ".join(f"s{i}" for i in range(257))), 400,
         "invalid_input: at most 256 scopes"),
        ("reinstall", _form(csrf, scopes="read"), 400,
         "field_not_allowed: reinstall may not change scopes"),
        ("change_owner", _form(csrf), 404, "unknown_action: no console action"),
    ]
    for verb, form, status, says in cases:
        got = await operator.post(f"/admin/bindings/crm-main/{verb}", form=form)
        text = await got.get_data(as_text=True)
        assert (got.status_code, says in text) == (status, True), (verb, form, text[-600:])
    unknown = await operator.post("/admin/bindings/nope/rebind",
                                  form=_form(csrf, remote_account_id="acct-2"))
    assert unknown.status_code == 409
    assert "unknown_binding: no binding nope" in await unknown.get_data(as_text=True)
    # Nothing different: nothing written (no audit entry either).
    same = await operator.post("/admin/bindings/crm-main/change_scopes",
                               form=_form(csrf, scopes="write read"))
    assert same.headers["Location"].endswith("notice=binding_unchanged")
    assert await bound.store.binding_get("crm-main") == FACTS
    assert await _mine(bound.store, "otto") == []
    # A disconnected binding changes no identity (reinstall reconnects it: the table).
    await bound.store.binding_transition("crm-main", BindingEvent.DISCONNECT,
                                         Actor("setup", "admin", "test"),
                                         expected_generation=1, now_us=T0 + 1)
    off = await operator.post("/admin/bindings/crm-main/change_issuer",
                              form=_form(csrf, issuer="https://x.test"))
    assert off.status_code == 409
    assert "binding_disconnected: binding crm-main is disconnected" in await off.get_data(
        as_text=True)
    page = await (await operator.get("/admin/bindings")).get_data(as_text=True)
    assert 'id="reinstall-crm-main"' in page and 'id="change_issuer-crm-main"' not in page
    assert await _mine(bound.store, "otto") == []


async def test_a_grant_that_needs_reauthorization_says_why_on_the_page_and_the_api(
        bound: ConsoleHarness) -> None:
    key = TokenKey("k1", bytes(range(32)))
    bundle = TokenBundle(access_token=SecretText("at-SECRET-9"),
                         refresh_token=SecretText("rt-SECRET-9"))
    await bound.store.grant_install(binding_id="crm-main", generation=1,
                                    sealed=seal(bundle, key, BundleContext("crm-main", 1, 1)),
                                    expires_at_us=0, now_us=T0)
    viewer, _ = await bound.sign_in("viv")
    doc = await (await viewer.get("/admin/api/bindings")).get_json()
    (item,) = doc["items"]
    assert (item["grant"]["state"], item["grant"]["reason"]) == ("valid", None)
    assert item["identity"] == {"issuer": "https://issuer.test", "remote_account_id": "acct-1",
                                "remote_subject": "app", "installation_id": None,
                                "scopes": ["read", "write"]}
    why = grant_reason("refresh_token_possibly_spent")
    assert await bound.store.grant_mark("crm-main", 1, 1, GrantState.NEEDS_REAUTHORIZATION,
                                        T0 + 1, why)
    answer = await viewer.get("/admin/api/bindings")
    doc = await answer.get_json()
    assert doc["items"][0]["grant"]["reason"] == {"code": why.code, "text": why.text}
    page = await (await viewer.get("/admin/bindings")).get_data(as_text=True)
    assert 'id="grant-reason-crm-main"' in page
    assert "<code>refresh_token_possibly_spent</code>: the token endpoint refused" in page
    for body in (page, await answer.get_data(as_text=True)):
        assert "SECRET" not in body
