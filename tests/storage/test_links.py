"""Conformance: RemoteLink transitions and uniqueness, on every backend."""

from __future__ import annotations

import pytest

from daemon.core.identity import integration_scope_digest
from storage.effect_values import LinkState
from storage.port import WorkConflict
from storage.work_store import WorkStore
from tests.support.work import T0

SCOPE = integration_scope_digest("org-1", "install-1", "hubspot", "portal-1")
WHO = {"actor": "alice", "role": "admin", "reason": "setup"}


async def test_create_then_finalize(store: WorkStore) -> None:
    slot = await store.link_create(SCOPE, "lead", "lead-1", T0)
    assert (slot.state, slot.remote_id, slot.generation) == (LinkState.PENDING_CREATE, None, 1)
    assert await store.link_create(SCOPE, "lead", "lead-1", T0) == slot  # idempotent
    active = await store.link_finalize(slot.link_key, "contact", " 101 ", T0)
    assert (active.state, active.remote_id) == (LinkState.ACTIVE, "101")
    assert await store.link_finalize(slot.link_key, "contact", "101", T0) == active


async def test_adopt_checks_uniqueness_on_both_sides(store: WorkStore) -> None:
    a = await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "101", now_us=T0, **WHO)
    assert a.state is LinkState.ACTIVE
    assert await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "101\n", now_us=T0,
                                  **WHO) == a
    with pytest.raises(WorkConflict, match="already linked to another local record"):
        await store.link_adopt(SCOPE, "lead", "lead-2", "contact", "101", now_us=T0, **WHO)
    with pytest.raises(WorkConflict, match="already linked"):
        await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "202", now_us=T0, **WHO)
    assert [e.action for e in await store.audit_list(target_id=a.link_key)] == ["link.adopt"]


async def test_rebind_and_retire_are_generation_cas(store: WorkStore) -> None:
    a = await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "101", now_us=T0, **WHO)
    moved = await store.link_rebind(a.link_key, "contact", "202", expected_generation=1,
                                    now_us=T0, **WHO)
    assert (moved.remote_id, moved.generation) == ("202", 2)
    with pytest.raises(WorkConflict, match="changed concurrently"):
        await store.link_rebind(a.link_key, "contact", "303", expected_generation=1,
                                now_us=T0, **WHO)
    # 101 is free again: another lead may adopt it.
    b = await store.link_adopt(SCOPE, "lead", "lead-2", "contact", "101", now_us=T0, **WHO)
    with pytest.raises(WorkConflict, match="already linked to another local record"):
        await store.link_rebind(b.link_key, "contact", "202", expected_generation=1,
                                now_us=T0, **WHO)
    with pytest.raises(WorkConflict, match="changed or is not retirable"):
        await store.link_retire(a.link_key, expected_generation=1, now_us=T0, **WHO)
    retired = await store.link_retire(a.link_key, expected_generation=2, now_us=T0, **WHO)
    assert retired.state is LinkState.RETIRED
    c = await store.link_adopt(SCOPE, "lead", "lead-3", "contact", "202", now_us=T0, **WHO)
    assert c.state is LinkState.ACTIVE
    # A retired local record may be adopted again (generation moves on).
    again = await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "404", now_us=T0, **WHO)
    assert (again.state, again.generation) == (LinkState.ACTIVE, 3)
    assert await store.link_get(SCOPE, "lead", "nobody") is None
