"""The console's link bind (issue 20 item 8; seed 7, 10): an admin binds a local record to an
existing remote record on the effects page (or its JSON API), as ``integrationd link bind``
does. Viewers and operators are refused, a missing CSRF token is refused, a refusal names
its stable code with a sentence and writes nothing; each bind is audited with the
admin's reason and the link before and after."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest

from admin_ui.app import create_app
from admin_ui.effects import effect_extensions
from config.catalog import load_catalog
from daemon.core.principals import scope_digest
from daemon.services.clock import WallClock
from daemon.services.principal_bootstrap import bootstrap_facts
from tests.admin.support import ConsoleHarness, console_harness, console_settings
from tests.support.backends import FreshDatabase
from tests.support.commands import HUBSPOT_MAIN

# The durable binding's remote account: where the console binds (docs/identity.md).
SCOPE = scope_digest(bootstrap_facts(HUBSPOT_MAIN))


@pytest.fixture
async def linked(database: FreshDatabase) -> AsyncIterator[ConsoleHarness]:
    """The console with the effect pages over a fresh database of each backend; the
    binding hubspot-main has its durable row."""
    settings = attrs.evolve(console_settings(), bindings=(HUBSPOT_MAIN,))
    async with console_harness(database, settings=settings) as harness:
        harness.app = create_app(harness.replica, effect_extensions(load_catalog(settings)))
        await harness.store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN),
                                              WallClock().now_us())
        yield harness


def _form(csrf: str, local_id: str, remote_id: str, generation: str = "",
          reason: str = "the CRM says so") -> dict[str, str]:
    return {"csrf_token": csrf, "binding_id": "hubspot-main", "local_object": "lead",
            "local_id": local_id, "remote_object": "contact", "remote_id": remote_id,
            "generation": generation, "reason": reason}


async def test_an_admin_binds_and_rebinds_on_the_effects_page(linked: ConsoleHarness) -> None:
    admin, csrf = await linked.sign_in("ada")
    page = await (await admin.get("/admin/effects")).get_data(as_text=True)
    assert 'id="bind-form"' in page
    done = await admin.post("/admin/effects/links/bind", form=_form(csrf, "lead-1", "101"))
    text = await done.get_data(as_text=True)
    assert done.status_code == 200, text[-400:]
    assert "Bound (adopted): lead lead-1 is contact 101, link generation 1." in text
    refused = await admin.post("/admin/effects/links/bind", form=_form(csrf, "lead-1", "202"))
    text = await refused.get_data(as_text=True)
    assert refused.status_code == 409
    assert ("generation_required: the local record is linked to another remote record at"
            " generation 1") in text
    moved = await admin.post("/admin/effects/links/bind",
                             form=_form(csrf, "lead-1", "202", generation="1"))
    text = await moved.get_data(as_text=True)
    assert moved.status_code == 200, text[-400:]
    assert "Bound (rebound): lead lead-1 is contact 202, link generation 2." in text
    entries = [(e.action, e.actor, e.role, e.reason) for e in await linked.store.audit_list()
               if e.action == "link.bind"]
    assert entries == [("link.bind", "ada", "admin", "the CRM says so")] * 2


async def test_viewers_operators_and_forged_posts_are_refused(linked: ConsoleHarness) -> None:
    for name in ("viv", "otto"):
        client, csrf = await linked.sign_in(name)
        page = await (await client.get("/admin/effects")).get_data(as_text=True)
        assert 'id="bind-form"' not in page  # no form for them
        got = await client.post("/admin/effects/links/bind", form=_form(csrf, "lead-1", "101"))
        assert got.status_code == 403, name
        api = await client.post("/admin/api/effects/links/bind",
                                json={"binding_id": "hubspot-main", "local_id": "lead-1",
                                      "remote_id": "101", "reason": "x"},
                                headers={"X-CSRF-Token": csrf})
        assert api.status_code == 403, name
    admin, csrf = await linked.sign_in("ada")
    forged = {k: v for k, v in _form(csrf, "lead-1", "101").items() if k != "csrf_token"}
    assert (await admin.post("/admin/effects/links/bind", form=forged)).status_code == 403
    assert await linked.store.link_get(SCOPE, "lead", "lead-1") is None
    assert [e for e in await linked.store.audit_list() if e.action == "link.bind"] == []


async def test_the_json_api_names_each_refusal_by_its_code(linked: ConsoleHarness) -> None:
    admin, csrf = await linked.sign_in("ada")
    headers = {"X-CSRF-Token": csrf}

    async def bind(**body: object) -> tuple[int, dict[str, object]]:
        doc = {"binding_id": "hubspot-main", "local_object": "lead", "remote_object":
               "contact", "reason": "by hand", **body}
        r = await admin.post("/admin/api/effects/links/bind", json=doc, headers=headers)
        return r.status_code, await r.get_json()

    status, doc = await bind(local_id="lead-1", remote_id="101")
    assert status == 200 and doc["outcome"] == "adopted"
    assert (await bind(local_id="lead-1", remote_id="101"))[1]["outcome"] == "unchanged"
    for body, code, answer in (
        ({"local_id": "lead-2", "remote_id": "101"}, 409, "remote_linked_elsewhere"),
        ({"local_id": "lead-1", "remote_id": "202"}, 409, "generation_required"),
        ({"local_id": "lead-1", "remote_id": "202", "generation": 4}, 409, "generation_moved"),
        ({"local_id": "lead-1", "remote_id": "202", "generation": "one"}, 400, "bad_request"),
        ({"local_id": "", "remote_id": "202"}, 400, "bad_request"),
        ({"local_id": "lead-1", "remote_id": "202", "binding_id": "nosuch"}, 400,
         "bad_request"),
    ):
        status, doc = await bind(**body)
        assert (status, doc["error"]) == (code, answer), (body, doc)
        assert isinstance(doc["message"], str) and doc["message"]
    link = await linked.store.link_get(SCOPE, "lead", "lead-1")
    assert link is not None and (link.remote_id, link.generation) == ("101", 1)
    spec = await (await admin.get("/admin/api/openapi.json")).get_json()
    assert "/admin/api/effects/links/bind" in spec["paths"]

