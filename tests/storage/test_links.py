"""Conformance: RemoteLink transitions and uniqueness, on every backend."""

from __future__ import annotations

import pytest

from daemon.core.identity import integration_scope_digest
from storage.effect_values import LinkState
from storage.links import note_modified
from storage.port import SqlTx, WorkConflict
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


async def _note(store: WorkStore, link_key: str, generation: int, remote_id: str,
                modified_at_us: int) -> bool:
    async def body(tx: SqlTx) -> bool:
        return await note_modified(tx, link_key, generation=generation, remote_id=remote_id,
                                   modified_at_us=modified_at_us)

    return await store.db.transact(body, name="test.note_modified")


async def test_the_link_keeps_the_records_last_modified_time_only_while_it_points_there(
        store: WorkStore) -> None:
    a = await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "101", now_us=T0, **WHO)
    assert a.modified_at_us is None
    assert await _note(store, a.link_key, 1, "101", 1_700_000_000_123_000)
    kept = await store.link_get(SCOPE, "lead", "lead-1")
    assert kept is not None and kept.modified_at_us == 1_700_000_000_123_000
    # Another generation, or another record: the link moved on, nothing is kept.
    assert not await _note(store, a.link_key, 2, "101", 5)
    assert not await _note(store, a.link_key, 1, "202", 5)
    moved = await store.link_rebind(a.link_key, "contact", "202", expected_generation=1,
                                    now_us=T0, **WHO)
    # A rebind points at another record: what was known of the old one is dropped.
    assert (moved.generation, moved.modified_at_us) == (2, None)
    retired = await store.link_retire(a.link_key, expected_generation=2, now_us=T0, **WHO)
    again = await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "101", now_us=T0, **WHO)
    assert (retired.state, again.generation, again.modified_at_us) == (
        LinkState.RETIRED, 3, None)
