"""Conformance: an operator binds a local record to an existing remote record (issue 20 item
8; seed 7, 10), on every backend.

Adopt, rebind (the generation moves), unchanged, or a refusal with a stable code that
writes nothing; audited as ``link.bind`` in the same transaction. A rebind moves the
link generation, so a command queued under the old one is refused at its dispatch
checkpoint (``link_generation``) and never reaches either record.
"""

from __future__ import annotations

import pytest

from daemon.core.link_bind import BindOutcome
from storage.effect_values import LinkState
from storage.effects import DispatchRefused
from storage.links import LinkBound, LinkRefused
from storage.work_store import WorkStore
from tests.support.commands import (
    TARGETS_SCOPE_DIGEST,
    accept_pinned,
    attempt,
    draft,
    target_key,
    target_remote,
)
from tests.support.work import SEC, T0, claim

SCOPE = TARGETS_SCOPE_DIGEST
WHO = {"actor": "ada", "role": "admin", "reason": "the lead is that contact"}


async def _bind(store: WorkStore, local_id: str, remote_id: str,
                generation: int | None = None) -> LinkBound:
    return await store.link_bind(SCOPE, "lead", local_id, "contact", remote_id,
                                 expected_generation=generation, now_us=T0, **WHO)


async def test_bind_adopts_then_rebinds_with_the_generation_seen(store: WorkStore) -> None:
    adopted = await _bind(store, "lead-1", "101")
    assert (adopted.outcome, adopted.before) == (BindOutcome.ADOPTED, None)
    assert (adopted.link.state, adopted.link.remote_id, adopted.link.generation) == (
        LinkState.ACTIVE, "101", 1)
    same = await _bind(store, "lead-1", " 101 ")
    assert (same.outcome, same.link) == (BindOutcome.UNCHANGED, adopted.link)
    rebound = await _bind(store, "lead-1", "202", generation=1)
    assert rebound.outcome is BindOutcome.REBOUND
    assert (rebound.link.remote_id, rebound.link.generation) == ("202", 2)
    assert rebound.before == adopted.link
    # 101 is free again: another local record may take it.
    other = await _bind(store, "lead-2", "101")
    assert other.outcome is BindOutcome.ADOPTED
    audit = await store.audit_list(target_id=adopted.link.link_key)
    assert sorted((e.action, e.actor, e.reason) for e in audit) == [
        ("link.bind", "ada", "the lead is that contact")] * 2  # unchanged writes nothing
    assert {e.after for e in audit} >= {
        '{"state": "active", "generation": 2, "remote_object": "contact", "remote_id": "202"}'}


async def test_bind_of_a_retired_link_moves_its_generation(store: WorkStore) -> None:
    first = await _bind(store, "lead-1", "101")
    await store.link_retire(first.link.link_key, expected_generation=1, now_us=T0, **WHO)
    again = await _bind(store, "lead-1", "303")
    assert (again.outcome, again.link.state, again.link.generation) == (
        BindOutcome.ADOPTED, LinkState.ACTIVE, 2)


@pytest.mark.parametrize(("local_id", "remote_id", "generation", "code"), [
    ("lead-2", "101", None, "remote_linked_elsewhere"),  # 101 is lead-1's
    ("lead-1", "202", None, "generation_required"),  # lead-1 is linked to 101
    ("lead-1", "202", 7, "generation_moved"),
    ("lead-9", "909", 1, "generation_moved"),  # no link at all
    ("lead-3", "303", None, "link_pending_create"),
])
async def test_bind_refusals_write_nothing(store: WorkStore, local_id: str, remote_id: str,
                                           generation: int | None, code: str) -> None:
    linked = await _bind(store, "lead-1", "101")
    await store.link_create(SCOPE, "lead", "lead-3", T0)
    audit = await store.audit_list()
    with pytest.raises(LinkRefused) as refused:
        await _bind(store, local_id, remote_id, generation)
    assert refused.value.code == code
    assert str(refused.value) == f"{code}: {refused.value.sentence}"
    assert await store.audit_list() == audit
    assert await store.link_get(SCOPE, "lead", "lead-1") == linked.link
    assert await store.link_get(SCOPE, "lead", "lead-9") is None


async def test_a_rebind_with_an_attempt_in_doubt_is_refused(store: WorkStore) -> None:
    accepted = await accept_pinned(store, draft(), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=600 * SEC)).claimed
    assert item.fence is not None
    await store.effect_checkpoint(item.fence, attempt(accepted.command_id), lambda: T0)
    with pytest.raises(LinkRefused) as refused:
        await _bind(store, "lead-1", "202", generation=1)
    assert refused.value.code == "unresolved_attempt"
    link = await store.link_get(SCOPE, "lead", "lead-1")
    assert link is not None and (link.remote_id, link.generation) == (target_remote("lead-1"), 1)


async def test_queued_work_pinned_to_the_old_generation_fails_closed(store: WorkStore) -> None:
    """The command was admitted against generation 1; an operator's rebind before its claim
    dispatches refuses its checkpoint: nothing is sent to either record."""
    accepted = await accept_pinned(store, draft(), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=600 * SEC)).claimed
    assert item.fence is not None
    rebound = await _bind(store, "lead-1", "202", generation=1)
    assert (rebound.link.link_key, rebound.link.generation) == (target_key("lead-1"), 2)
    with pytest.raises(DispatchRefused) as refused:
        await store.effect_checkpoint(item.fence, attempt(accepted.command_id), lambda: T0 + SEC)
    assert refused.value.code == "link_generation"
    assert await store.effect_attempts(accepted.command_id) == []
