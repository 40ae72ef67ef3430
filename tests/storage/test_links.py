"""Conformance: RemoteLink transitions and uniqueness, on every backend."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.identity import integration_scope_digest
from storage.effect_values import LinkState, RemoteLink, Settlement
from storage.effects import settle
from storage.port import SqlTx, WorkConflict
from storage.work_store import WorkStore
from tests.support.commands import draft
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


async def _settled(store: WorkStore, link: RemoteLink, intent_id: str,
                   modified_at_us: int | None) -> None:
    """A command pinned to ``link`` as it is now, settled with the last-modified time
    its accepted answer named (None: the answer named none)."""
    result = await store.command_accept(
        attrs.evolve(draft(intent_id), link_key=link.link_key), T0)
    assert result.command_id is not None
    await _settle(store, result.command_id, modified_at_us)


async def _settle(store: WorkStore, command_id: str, modified_at_us: int | None) -> None:
    async def body(tx: SqlTx) -> str:
        return await settle(tx, command_id=command_id, settlement=Settlement.SUCCEEDED,
                            result_format_version=1, remote_id="", canonical_result="",
                            result_digest="", receipt_max_attempts=5, now_us=T0,
                            modified_at_us=modified_at_us)

    await store.db.transact(body, name="test.settle")


async def _modified(store: WorkStore) -> int | None:
    link = await store.link_get(SCOPE, "lead", "lead-1")
    assert link is not None
    return link.modified_at_us


async def test_the_link_knows_the_records_last_modified_time_only_while_it_points_there(
        store: WorkStore) -> None:
    """The time is kept on each settled command (migration 0035); the link reads the
    newest among the commands pinned to its current generation and remote id."""
    a = await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "101", now_us=T0, **WHO)
    assert a.modified_at_us is None
    await _settled(store, a, "int-1", 1_700_000_000_123_000)
    assert await _modified(store) == 1_700_000_000_123_000
    await _settled(store, a, "int-2", 1_700_000_000_456_000)
    assert await _modified(store) == 1_700_000_000_456_000  # the newest change's
    await _settled(store, a, "int-3", None)  # an answer that named no time
    assert await _modified(store) == 1_700_000_000_456_000
    # A command pinned before the rebind settles after it: the link moved on.
    late = await store.command_accept(attrs.evolve(draft("int-4"), link_key=a.link_key), T0)
    assert late.command_id is not None
    moved = await store.link_rebind(a.link_key, "contact", "202", expected_generation=1,
                                    now_us=T0, **WHO)
    # A rebind points at another record: nothing is known of it.
    assert (moved.generation, moved.modified_at_us) == (2, None)
    await _settle(store, late.command_id, 1_700_000_000_999_000)
    assert await _modified(store) is None
    await _settled(store, moved, "int-5", 1_700_000_001_000_000)
    assert await _modified(store) == 1_700_000_001_000_000
    retired = await store.link_retire(a.link_key, expected_generation=2, now_us=T0, **WHO)
    again = await store.link_adopt(SCOPE, "lead", "lead-1", "contact", "101", now_us=T0, **WHO)
    # Back on record 101, generation 3: what generation 1 knew of it is not trusted.
    assert (retired.state, again.generation, again.modified_at_us) == (
        LinkState.RETIRED, 3, None)
