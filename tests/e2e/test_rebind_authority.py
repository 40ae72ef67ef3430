"""After a rebind, the durable binding is the authority for new work (issue 9, item 1).

The operator (or the Runtime's connect flow) rebinds ``hubspot-main`` from remote account
portal-1 to portal-2; the TOML's ``[[bindings]]`` entry still says portal-1. A command
admitted *after* the rebind is scoped by the durable binding's account: its link key is
portal-2's, so a Lead linked only under portal-1 has no link for it and the command is
refused before dispatch (``no_remote_link``); it is never sent to portal-2's credentials
with portal-1's remote id. A Lead linked under portal-2 is sent as usual.
"""

from __future__ import annotations

import attrs
import pytest

from daemon.core.identity import integration_link_key_v2, integration_scope_digest
from daemon.core.principals import BindingEvent
from daemon.core.states import WorkState
from daemon.services.clock import WallClock
from daemon.services.principal_bootstrap import ensure_config_bindings
from storage.effect_values import Settlement
from storage.port import WorkQuery
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.slice import LINK_SCOPE, SCOPE, running_slice

pytestmark = pytest.mark.slow

B_SCOPE = integration_scope_digest(SCOPE.org_id, SCOPE.app_installation_id, "hubspot",
                                   "portal-2")


async def rebind_to_portal_2(store: WorkStore) -> None:
    """The audited transition (what `/v1/bindings/.../rebind` and the CLI apply)."""
    current = await store.binding_get("hubspot-main")
    assert current is not None and current.identity.remote_account_id == "portal-1"
    moved = await store.binding_transition(
        "hubspot-main", BindingEvent.CHANGE,
        Actor(name="ada", role="admin", reason="the org moved to portal 2"),
        expected_generation=current.generation, now_us=WallClock().now_us(),
        identity=attrs.evolve(current.identity, remote_account_id="portal-2",
                              remote_subject="portal-2"))
    assert moved.generation == current.generation + 1


async def test_a_command_admitted_after_a_rebind_uses_the_durable_account(
        database: FreshDatabase, store: WorkStore) -> None:
    async with running_slice(store, database.url) as sl:
        # lead-1 is linked under portal-1 (before the rebind) to contact 101; lead-2 is
        # linked under portal-2 to contact 202 (the new account's record).
        await sl.lead("lead-1", "101")
        await sl.lead("lead-2", "202", link=False)
        await ensure_config_bindings(store, sl.settings.bindings, WallClock().now_us())
        await rebind_to_portal_2(store)
        await store.link_adopt(B_SCOPE, "lead", "lead-2", "contact", "202", actor="ada",
                               role="admin", reason="the lead's contact in portal 2",
                               now_us=WallClock().now_us())
        one = await sl.set_title("lead-1", "CTO")
        two = await sl.set_title("lead-2", "CFO")
        await sl.wait_intent("lead-2", two, "COMMITTED")
        await sl.wait_intent("lead-1", one, "COMMITTED")
        items = {i.subject_id: i for i in await store.work_list(
            WorkQuery(family="external_effect"))}
        commands = {c.local_id: c for c in [await store.command_get(s) for s in items]
                    if c is not None}
        # Both commands pin the durable generation (2) and portal-2's link scope.
        for lead in ("lead-1", "lead-2"):
            assert commands[lead].binding_generation == 2
            assert commands[lead].link_key == integration_link_key_v2(B_SCOPE, "lead", lead)
        assert commands["lead-1"].link_key != integration_link_key_v2(LINK_SCOPE, "lead",
                                                                      "lead-1")
        # lead-1: refused before dispatch, with a stable reason; nothing was sent.
        c1 = commands["lead-1"]
        assert (c1.remote_id, c1.settlement) == (None, Settlement.NO_EFFECT)
        got = await store.work_get(items[c1.command_id].work_id)
        assert got is not None
        assert (got.state, got.terminal_outcome, got.failure_class) == (
            WorkState.SUCCEEDED, "no_effect", "no_remote_link")
        assert await store.effect_attempts(c1.command_id) == []
        # The simulator saw one PATCH, for portal-2's contact 202, and nothing for 101.
        assert [(r.method, r.contact_id) for r in sl.sim.requests
                if r.method == "PATCH"] == [("PATCH", "202")]
        assert sl.patches("101") == []
        untouched = sl.sim.contact("101")
        assert untouched is not None and untouched["patches_applied"] == 0
