"""Queued work cannot be retargeted (seed 8.1, 13; issue 8, item 3).

A command pins, at admission, the durable binding generation and the RemoteLink
it targets (generation and remote id). A link rebind, or a disconnect or reconnect
of the binding, between acceptance and dispatch must not redirect it: the simulator
receives nothing for that command, and the operator sees why on the work item's page.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import trio

from daemon.core.principals import BindingEvent
from daemon.core.states import WorkState
from daemon.services.clock import WallClock
from sandbox.ports import free_port
from storage.effect_values import Settlement
from storage.port import WorkQuery
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.services.test_dispatch_pins import (
    KEY,
    NEW_ACCESS,
    expired_grant_and_foreign_refresh,
    winner_activates,
)
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import LINK_SCOPE, Slice, SliceGrant, running_slice
from tests.ui.support import _OPERATORS, PASSWORDS

pytestmark = pytest.mark.slow


async def _signed_in(sl: Slice, name: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=sl.base_url, timeout=10)
    form = await client.get("/admin/sign-in")
    found = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert found is not None
    r = await client.post("/admin/sign-in", data={
        "name": name, "password": PASSWORDS[name], "csrf_token": found.group(1),
        "next": "/admin/"})
    assert r.status_code == 302, r.text
    return client


@pytest.mark.parametrize(("rebind", "binding", "code", "sentence"), [
    (True, "", "link_generation",
     "the pinned remote link generation 1 is no longer current (2)"),
    (False, "reconnect", "binding_generation",
     "the pinned binding generation 1 is no longer current (2)"),
    (True, "reconnect", "binding_generation",
     "the pinned binding generation 1 is no longer current (2)"),
    (False, "disconnect", "binding_disconnected", "the pinned binding is disconnected"),
])
async def test_rebind_between_accept_and_dispatch_sends_nothing(
    database: FreshDatabase, store: WorkStore, rebind: bool, binding: str, code: str,
    sentence: str,
) -> None:
    port = free_port()  # one simulator address: the Catalog revision stays the same
    async with running_slice(store, database.url, with_replica=False, hubspot_port=port) as sl:
        await sl.lead("lead-1", "101")
        intent_id = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", intent_id, "ACCEPTED")
        if rebind:
            link = await store.link_get(LINK_SCOPE, "lead", "lead-1")
            assert link is not None
            await store.link_rebind(link.link_key, "contact", "202",
                                    expected_generation=link.generation, actor="ada",
                                    role="admin", reason="the lead moved to another contact",
                                    now_us=WallClock().now_us())
    # The operator disconnects the durable binding (and reconnects it: a new
    # generation) through the audited transition; the TOML is not edited.
    who = Actor(name="ada", role="admin", reason="the portal was reinstalled")
    now = WallClock().now_us()
    if binding:
        await store.binding_transition("hubspot-main", BindingEvent.DISCONNECT, who,
                                       expected_generation=1, now_us=now)
    if binding == "reconnect":
        await store.binding_transition("hubspot-main", BindingEvent.RECONNECT, who,
                                       expected_generation=1, now_us=now)
    async with running_slice(store, database.url, operators=_OPERATORS,
                             hubspot_port=port) as sl2:
        sl2.sim.add_contact("101", jobtitle="Engineer")
        sl2.sim.add_contact("202", jobtitle="Engineer")
        (item,) = await store.work_list(WorkQuery(family="external_effect"))

        async def finished() -> bool:
            got = await store.work_get(item.work_id)
            return got is not None and got.state.value not in ("pending", "retry", "processing")

        await wait_for(finished, within_s=30)
        assert sl2.sim.requests == []  # neither the old nor the new identity was called
        got = await store.work_get(item.work_id)
        assert got is not None
        # Refused before dispatch, proven effect-free: settled, nothing left in the DLQ.
        assert (got.state, got.terminal_outcome, got.failure_class) == (
            WorkState.SUCCEEDED, "no_effect", code)
        assert sentence in (got.operator_summary or "")
        command = await store.command_get(item.subject_id)
        assert command is not None and command.settlement is Settlement.NO_EFFECT
        assert await store.effect_attempts(item.subject_id) == []
        # The operator sees why on the work item's page.
        client = await _signed_in(sl2, "viv")
        try:
            page = await client.get(f"/admin/work/{item.work_id}")
        finally:
            await client.aclose()
        assert page.status_code == 200
        assert code in page.text and sentence in page.text


@pytest.mark.parametrize(("change", "code"), [
    ("link_rebind", "link_generation"),
    ("binding_reconnect", "binding_generation"),
])
async def test_a_pin_moved_while_dispatch_waits_for_a_token_sends_nothing_on_every_backend(
    database: FreshDatabase, store: WorkStore, tmp_path: Path, change: str, code: str,
) -> None:
    """Issue 20 item 2, on the wall clock and every backend (the MockClock version with
    the Runtime's receipt is tests/services/test_dispatch_pins.py): the claim has read its
    context and waits for another claimant's token refresh; a rebind or a reconnect
    commits, then the refresh answers. The dispatch checkpoint refuses the moved pin:
    nothing is sent, the command settles NO_EFFECT with the pin's code."""
    clock = WallClock()
    (tmp_path / "k1.key").write_text(KEY.material.hex())
    lease_token = await expired_grant_and_foreign_refresh(store, clock)
    grant = SliceGrant(token_url="http://127.0.0.1:9/oauth/v1/token", client_secret="c",
                       key_dir=str(tmp_path), tokens={NEW_ACCESS})
    async with running_slice(store, database.url, grant=grant) as sl:
        await sl.lead("lead-1", "101")
        sl.sim.add_contact("202", jobtitle="Engineer")
        await sl.set_title("lead-1", "CTO")

        async def processing() -> bool:
            items = await store.work_list(WorkQuery(family="external_effect"))
            return bool(items) and items[0].state.value == "processing"

        await wait_for(processing, within_s=30)
        await trio.sleep(1.0)  # it has read its context and waits (bounded at 35 s)
        assert sl.sim.requests == []
        who = Actor(name="ada", role="admin", reason="the portal was reinstalled")
        if change == "link_rebind":
            link = await store.link_get(LINK_SCOPE, "lead", "lead-1")
            assert link is not None
            await store.link_rebind(link.link_key, "contact", "202",
                                    expected_generation=link.generation, actor="ada",
                                    role="admin", reason="another contact",
                                    now_us=clock.now_us())
        else:
            await store.binding_transition("hubspot-main", BindingEvent.DISCONNECT, who,
                                           expected_generation=1, now_us=clock.now_us())
            await store.binding_transition("hubspot-main", BindingEvent.RECONNECT, who,
                                           expected_generation=1, now_us=clock.now_us())
        await winner_activates(store, clock, lease_token)
        (item,) = await store.work_list(WorkQuery(family="external_effect"))

        async def settled() -> bool:
            command = await store.command_get(item.subject_id)
            return command is not None and command.settlement is not Settlement.OPEN

        await wait_for(settled, within_s=60)
        assert [(r.method, r.contact_id) for r in sl.sim.requests] == []
    got = await store.work_get(item.work_id)
    assert got is not None and (got.terminal_outcome, got.failure_class) == ("no_effect", code)
    assert await store.effect_attempts(item.subject_id) == []
