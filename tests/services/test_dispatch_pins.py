"""Dispatch is atomic with its pins (issue 20 item 2; seed 8.1, seed 13 "reconnect cannot
retarget queued work", "binding reinstall/reconnect fencing").

A claim reads its context (the command's pins against the binding and the link as they
are) and then, before its dispatch checkpoint, may wait: for another replica's token
refresh, for a quota slot. A link rebind or a binding reconnect that commits in that
window must still stop the send: the checkpoint statement itself carries every pin, and a
moved pin is a classified refusal before dispatch, so the Runtime gets the true receipt
(``NO_EFFECT`` / ``REJECTED_BEFORE_DISPATCH``: no attempt reached provider I/O).

Real parts: the HubSpot simulator and the reference Runtime are real servers on loopback,
the database is real (SQLite: under MockClock's autojump a network adapter's own I/O
deadlines jump too; the checkpoint's pin rows run on every backend in
tests/storage/test_checkpoint_pins.py). The window is a real one: another claimant holds
the binding generation's refresh lease, so this claim waits for its new token version.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from daemon.core.principals import BindingEvent
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.services.clock import Clock, TrioClock
from storage.effect_values import Settlement
from storage.idgen import new_lease_token
from storage.port import SqlTx, WorkQuery
from storage.principals import Actor
from storage.refresh_leases import LeaseWon, refresh_lease_acquire
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.slice import LINK_SCOPE, SliceGrant, running_slice
from tests.support.work import claim, enqueue

SEC = 1_000_000
KEY = TokenKey("k1", bytes(range(32)))
OLD_ACCESS = "access-SECRET-expired"
NEW_ACCESS = "access-SECRET-v2"  # the only token the simulator accepts


@pytest.fixture
def backend() -> str:
    return "sqlite"


async def expired_grant_and_foreign_refresh(store: WorkStore, clock: Clock) -> str:
    """Generation 1's grant holds an expired version 1; another claimant (a live claim
    of another family) holds its refresh lease, its refresh in flight. Returns that
    lease's token."""
    now = clock.now_us()
    bundle = TokenBundle(access_token=SecretText(OLD_ACCESS),
                         refresh_token=SecretText("refresh-SECRET-0"), expires_at_us=now - 1)
    await store.grant_install(binding_id="hubspot-main", generation=1,
                              sealed=seal(bundle, KEY, BundleContext("hubspot-main", 1, 1)),
                              expires_at_us=now - 1, now_us=now)
    await enqueue(store, 1, now=now, family="other_replica")
    (holder,) = (await claim(store, now=now, ttl=3600 * SEC, family="other_replica")).claimed
    assert holder.fence is not None
    token = new_lease_token()
    fence = holder.fence

    async def take(tx: SqlTx) -> object:
        return await refresh_lease_acquire(
            tx, binding_id="hubspot-main", generation=1, seen_version=1, lease_token=token,
            work_id=fence.work_id, epoch=fence.ownership_epoch, ttl_us=600 * SEC, now_us=now)

    assert isinstance(await store.db.transact(take, name="test.lease"), LeaseWon)
    return token


async def winner_activates(store: WorkStore, clock: Clock, lease_token: str) -> None:
    """The other claimant's refresh answers: version 2 of generation 1 is activated."""
    new = TokenBundle(access_token=SecretText(NEW_ACCESS),
                      refresh_token=SecretText("refresh-SECRET-1"),
                      expires_at_us=clock.now_us() + 3600 * SEC)
    assert await store.refresh_activate(
        binding_id="hubspot-main", generation=1, lease_token=lease_token, from_version=1,
        sealed=seal(new, KEY, BundleContext("hubspot-main", 1, 2)),
        expires_at_us=new.expires_at_us, now_us=clock.now_us())


@pytest.mark.parametrize(("change", "code"), [
    ("link_rebind", "link_generation"),
    ("binding_reconnect", "binding_generation"),
    ("binding_disconnect", "binding_disconnected"),
])
async def test_a_pin_moved_while_dispatch_waits_for_a_token_sends_nothing(
    database: FreshDatabase, store: WorkStore, tmp_path: Path,
    autojump_clock: trio.testing.MockClock, change: str, code: str,
) -> None:
    clock = TrioClock()
    (tmp_path / "k1.key").write_text(KEY.material.hex())
    lease_token = await expired_grant_and_foreign_refresh(store, clock)
    grant = SliceGrant(token_url="http://127.0.0.1:9/oauth/v1/token", client_secret="c",
                       key_dir=str(tmp_path), tokens={NEW_ACCESS})
    async with running_slice(store, database.url, grant=grant, clock=clock) as sl:
        await sl.lead("lead-1", "101")
        sl.sim.add_contact("202", jobtitle="Engineer")
        intent_id = await sl.set_title("lead-1", "CTO")

        async def processing() -> bool:
            items = await store.work_list(WorkQuery(family="external_effect"))
            return bool(items) and items[0].state.value == "processing"

        await wait_for(processing, within_s=30)
        # The claim has read its context (pins current) and waits for the other
        # claimant's refresh (its wait is bounded at 35 s).
        await trio.sleep(5)
        assert sl.sim.requests == []
        who = Actor(name="ada", role="admin", reason="the portal was reinstalled")
        if change == "link_rebind":
            link = await store.link_get(LINK_SCOPE, "lead", "lead-1")
            assert link is not None
            await store.link_rebind(link.link_key, "contact", "202",
                                    expected_generation=link.generation, actor="ada",
                                    role="admin", reason="the lead is another contact",
                                    now_us=clock.now_us())
        else:
            await store.binding_transition("hubspot-main", BindingEvent.DISCONNECT, who,
                                           expected_generation=1, now_us=clock.now_us())
            if change == "binding_reconnect":
                await store.binding_transition("hubspot-main", BindingEvent.RECONNECT, who,
                                               expected_generation=1, now_us=clock.now_us())
        await winner_activates(store, clock, lease_token)
        await sl.wait_intent("lead-1", intent_id, "COMMITTED", within_s=120)
        # Nothing left for either identity: neither the old record nor the new one.
        assert [(r.method, r.contact_id) for r in sl.sim.requests] == []
        state = sl.runtime.store.intents[intent_id]
        assert state.receipt is not None
        assert state.receipt.result_format_version == 2
        assert json.loads(state.receipt.canonical_result) == {
            "outcome": "NO_EFFECT", "reason": "REJECTED_BEFORE_DISPATCH", "version": 1}
    (item,) = await store.work_list(WorkQuery(family="external_effect"))
    assert (item.state.value, item.terminal_outcome, item.failure_class) == (
        "succeeded", "no_effect", code)
    command = await store.command_get(item.subject_id)
    assert command is not None and command.settlement is Settlement.NO_EFFECT
    assert await store.effect_attempts(item.subject_id) == []
