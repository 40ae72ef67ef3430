"""The console's binding transitions: disconnect stops dispatch under a binding and keeps
its generation; reconnect moves the generation. Each needs an operator, the CSRF token, a
reason and the generation the operator saw (a compare-and-swap); a refusal writes
nothing; each transition is audited with the operator's reason."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest

from config.settings import BindingSettings
from daemon.core.principals import (
    BindingEvent,
    BindingIdentity,
    BindingState,
    PrincipalKind,
    connect,
)
from storage.principals import Actor
from tests.admin.support import ConsoleHarness, console_harness, console_settings
from tests.support.backends import FreshDatabase
from tests.support.work import T0

BINDING = BindingSettings(binding_id="crm-main", provider="hubspot", org_id="org-1",
                          app_installation_id="app-1", remote_account_id="acct-1",
                          base_url="http://127.0.0.1:9")
FACTS = connect(binding_id="crm-main", kind=PrincipalKind.SHARED, org_id="org-1",
                app_installation_id="app-1", provider="hubspot",
                identity=BindingIdentity(issuer="https://issuer.test",
                                         remote_account_id="acct-1", remote_subject="app"))


@pytest.fixture
async def bound(database: FreshDatabase) -> AsyncIterator[ConsoleHarness]:
    """The console over a fresh database of each backend, one binding connected."""
    settings = attrs.evolve(console_settings(), bindings=(BINDING,))
    async with console_harness(database, settings=settings) as harness:
        await harness.store.binding_connect(FACTS, Actor("setup", "admin", "test"), T0)
        yield harness


def _form(csrf: str, generation: object = 1, reason: str | None = "token leaked"
          ) -> dict[str, str]:
    form = {"csrf_token": csrf, "generation": str(generation)}
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
