"""Conformance: effect lanes never let an older intent overwrite a newer one (issue 8
item 9), on every backend."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.outcomes import DeadLetter
from storage.command_repair import RepairActor
from storage.effect_values import CommandDraft, Settlement
from storage.port import WorkConflict, WorkQuery
from storage.work_store import WorkStore
from tests.storage.test_effect_journal import record, settle_fenced
from tests.support.commands import accept_pinned, attempt, draft, publish_test_revision
from tests.support.work import SEC, T0, claim, finalize

WHO = RepairActor(actor="otto", role="operator", reason="again")


async def _linked(store: WorkStore, lead: str = "lead-1", contact: str = "7") -> str:
    link = await store.link_adopt("c" * 64, "lead", lead, "contact", contact, actor="t",
                                  role="admin", reason="seed", now_us=T0)
    return link.link_key


def _with_link(d: CommandDraft, link_key: str) -> CommandDraft:
    return attrs.evolve(d, link_key=link_key)


async def test_effect_commands_take_their_remote_record_as_target_lane(
    store: WorkStore,
) -> None:
    key = await _linked(store)
    link = await store.link_get("c" * 64, "lead", "lead-1")
    assert link is not None and link.locator_hash
    await store.command_accept(_with_link(draft(), key), T0)
    unlinked = await _linked_slot(store)
    await store.command_accept(_with_link(draft("int-2", lead="lead-2"), unlinked), T0)
    items = {i.subject_id: i for i in await store.work_list(WorkQuery(family="external_effect"))}
    lanes = sorted(str(i.target_lane) for i in items.values())
    assert lanes == sorted([f"remote:{link.locator_hash}", f"link:{unlinked}"])


async def _linked_slot(store: WorkStore) -> str:
    slot = await store.link_create("c" * 64, "lead", "lead-2", T0)
    return slot.link_key


async def test_two_commands_for_one_remote_record_never_run_at_once(store: WorkStore) -> None:
    key = await _linked(store)
    await store.command_accept(_with_link(draft("int-1", title="A"), key), T0)
    # Another source lane (say, a second Runtime capability) names the same link.
    other = attrs.evolve(draft("int-2", title="B"), lane="elsewhere")
    await store.command_accept(_with_link(other, key), T0)
    first = (await claim(store, family="external_effect")).claimed
    assert len(first) == 1
    assert (await claim(store, family="external_effect", owner="B")).claimed == []


async def _settled_newer(store: WorkStore) -> tuple[str, str]:
    """int-1 (Title A) dies before landing; the newer int-2 (Title B) succeeds."""
    old = await accept_pinned(store, draft("int-1", title="A"), T0)
    new = await accept_pinned(store, draft("int-2", title="B"), T0 + SEC)
    assert old.command_id is not None and new.command_id is not None
    (head,) = (await claim(store, family="external_effect", limit=1)).claimed
    assert head.subject_id == old.command_id and head.fence is not None
    await finalize(store, head, DeadLetter("no_remote_link", "no link yet"))
    (newer,) = (await claim(store, family="external_effect", now=T0 + 2 * SEC)).claimed
    assert newer.subject_id == new.command_id and newer.fence is not None
    attempt_id = await store.effect_checkpoint(newer.fence, attempt(new.command_id),
                                               lambda: T0 + 2 * SEC)
    await record(store, newer.fence, attempt_id, T0 + 2 * SEC, outcome="ACCEPTED", status=200)
    await settle_fenced(store, newer.fence, new.command_id, T0 + 2 * SEC,
                        settlement=Settlement.SUCCEEDED, result_format=1, remote_id="7")
    return old.command_id, new.command_id


async def test_a_replay_of_an_intent_superseded_by_a_newer_settled_one_is_refused(
    store: WorkStore,
) -> None:
    old, new = await _settled_newer(store)
    reason = await store.command_superseded(old)
    assert reason is not None and "int-2" in reason and "jobtitle" in reason
    assert new in reason
    # The newer one is superseded by nothing.
    assert await store.command_superseded(new) is None


async def test_a_repair_of_an_intent_superseded_by_a_newer_settled_one_is_refused(
    store: WorkStore,
) -> None:
    old, _ = await _settled_newer(store)
    await publish_test_revision(store)
    with pytest.raises(WorkConflict, match="superseded"):
        await store.command_repair(old, WHO, binding_generation=1, catalog_revision=7,
                                   catalog_digest="sha256:catalog", max_attempts=8,
                                   now_us=T0 + 10 * SEC)
    assert await store.command_repaired_by(old) is None


async def test_an_older_intent_on_another_field_or_record_is_not_superseded(
    store: WorkStore,
) -> None:
    old = await store.command_accept(draft("int-1", title="A"), T0)
    other_lead = await store.command_accept(draft("int-2", title="B", lead="lead-9"), T0 + SEC)
    assert old.command_id is not None and other_lead.command_id is not None
    claimed = (await claim(store, family="external_effect", now=T0 + SEC)).claimed
    assert len(claimed) == 2
    for item in claimed:
        assert item.fence is not None
        if item.subject_id == other_lead.command_id:
            await settle_fenced(store, item.fence, item.subject_id, T0 + 2 * SEC,
                                settlement=Settlement.SUCCEEDED, result_format=1,
                                remote_id="9")
    assert await store.command_superseded(old.command_id) is None
