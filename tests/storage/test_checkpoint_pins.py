"""Conformance: the dispatch checkpoint carries every pin (issue 20 item 2; seed 8.1, 13),
on every backend.

The claim reads its context, then (after its waits) writes the checkpoint. A pin that
moved in between (a reconnect, a reinstall, a link rebind, a retired link, a revision
not the pinned one) is refused by the checkpoint's own transaction with the stable code
the next claim would give: no attempt is written, the claim stays live (the runner settles
the refusal in its fenced finalization), and other requests of the same batch are not
affected. One row per pin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import pytest

from daemon.core.principals import BindingEvent
from daemon.core.states import WorkState
from daemon.core.work import WorkItem
from storage.effects import DispatchRefused
from storage.port import PublishParams, SqlTx
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.commands import (
    TARGETS_SCOPE_DIGEST,
    accept_pinned,
    attempt,
    dispatch_pins,
    draft,
    target_key,
)
from tests.support.work import SEC, T0, claim

WHO = Actor(name="ada", role="admin", reason="the portal was reinstalled")
LATER = T0 + SEC


async def _claimed(store: WorkStore, lead: str = "lead-1") -> tuple[str, WorkItem]:
    accepted = await accept_pinned(store, draft(f"int-{lead}", lead=lead), T0)
    assert accepted.command_id is not None
    claimed = (await claim(store, family="external_effect", ttl=600 * SEC)).claimed
    (item,) = [i for i in claimed if i.subject_id == accepted.command_id]
    return accepted.command_id, item


async def _reconnect(store: WorkStore) -> None:
    await store.binding_transition("hubspot-main", BindingEvent.DISCONNECT, WHO,
                                   expected_generation=1, now_us=LATER)
    await store.binding_transition("hubspot-main", BindingEvent.RECONNECT, WHO,
                                   expected_generation=1, now_us=LATER)


async def _disconnect(store: WorkStore) -> None:
    await store.binding_transition("hubspot-main", BindingEvent.DISCONNECT, WHO,
                                   expected_generation=1, now_us=LATER)


async def _rebind_same_record(store: WorkStore) -> None:
    # A rebind to the same record still moves the generation: the pin is the generation.
    await store.link_rebind(target_key("lead-1"), "contact", "r-lead-1", expected_generation=1,
                            actor="ada", role="admin", reason="re-checked", now_us=LATER)


async def _rebind_other_record(store: WorkStore) -> None:
    await store.link_rebind(target_key("lead-1"), "contact", "r-other", expected_generation=1,
                            actor="ada", role="admin", reason="another contact",
                            now_us=LATER)


async def _remote_id_rewritten(store: WorkStore) -> None:
    # No transition changes the remote id without the generation; the statement must
    # still compare the remote id itself (a row restored from a backup, a bad migration).
    async def body(tx: SqlTx) -> None:
        await tx.execute("UPDATE remote_links SET remote_id = ? WHERE link_key = ?",
                         ("r-other", target_key("lead-1")))

    await store.db.transact(body, name="test.rewrite")


async def _retire(store: WorkStore) -> None:
    await store.link_retire(target_key("lead-1"), expected_generation=1, actor="ada",
                            role="admin", reason="the contact was merged", now_us=LATER)


Change = Callable[[WorkStore], Awaitable[None]]


@pytest.mark.parametrize(("change", "code", "sentence"), [
    (_reconnect, "binding_generation",
     "the pinned binding generation 1 is no longer current (2)"),
    (_disconnect, "binding_disconnected", "the pinned binding is disconnected"),
    (_rebind_same_record, "link_generation",
     "the pinned remote link generation 1 is no longer current (2)"),
    (_rebind_other_record, "link_generation",
     "the pinned remote link generation 1 is no longer current (2)"),
    (_remote_id_rewritten, "remote_id_changed",
     "the pinned remote record is no longer the linked one"),
    (_retire, "link_inactive", "the pinned remote link is no longer active"),
], ids=["binding_generation_moved", "binding_not_active", "link_generation_moved",
        "link_rebound_elsewhere", "link_remote_id_changed", "link_retired"])
async def test_a_pin_moved_after_the_claim_refuses_the_checkpoint(
    store: WorkStore, change: Change, code: str, sentence: str,
) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    await change(store)
    with pytest.raises(DispatchRefused) as refused:
        await store.effect_checkpoint(item.fence, attempt(command_id), lambda: LATER)
    assert (refused.value.code, refused.value.sentence) == (code, sentence)
    assert await store.effect_attempts(command_id) == []
    got = await store.work_get(item.work_id)
    assert got is not None and got.state is WorkState.PROCESSING  # the claim is still live


async def test_every_pin_current_the_checkpoint_is_written(store: WorkStore) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), lambda: LATER)
    assert [a.attempt_id for a in await store.effect_attempts(command_id)] == [attempt_id]


async def test_a_request_built_from_another_revision_is_refused(store: WorkStore) -> None:
    """Catalog revision not the pinned one: revision 8 is stored and current, the command
    pinned 7; a request built from 8's definitions never leaves."""
    command_id, item = await _claimed(store)
    assert item.fence is not None
    await store.catalog_publish(PublishParams(revision=8, digest="sha256:catalog-8",
                                              content="{}", actor="t", role="admin",
                                              reason="a newer revision"), LATER)
    built_from_8 = attrs.evolve(attempt(command_id), pins=attrs.evolve(
        dispatch_pins(), catalog_revision=8, catalog_digest="sha256:catalog-8"))
    with pytest.raises(DispatchRefused) as refused:
        await store.effect_checkpoint(item.fence, built_from_8, lambda: LATER)
    assert refused.value.code == "catalog_revision"
    assert refused.value.sentence == (
        "the request was built from Catalog revision 8 (sha256:catalog-8), not the pinned"
        " revision 7 (sha256:catalog)")
    assert await store.effect_attempts(command_id) == []


async def test_a_pinned_revision_that_is_not_stored_refuses_the_checkpoint(
    store: WorkStore,
) -> None:
    """Catalog revision not the pinned one: the command pins a revision no row stores (a
    delete raced its admission, see storage/catalog_revisions.py)."""
    accepted = await accept_pinned(store, attrs.evolve(draft(), catalog_revision=9,
                                                       catalog_digest="sha256:nine"), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=600 * SEC)).claimed
    assert item.fence is not None
    pins = attrs.evolve(dispatch_pins(), catalog_revision=9, catalog_digest="sha256:nine")
    with pytest.raises(DispatchRefused) as refused:
        await store.effect_checkpoint(
            item.fence, attrs.evolve(attempt(accepted.command_id), pins=pins), lambda: LATER)
    assert (refused.value.code, refused.value.sentence) == (
        "catalog_revision_unavailable",
        "the pinned Catalog revision 9 (sha256:nine) is not stored")
    assert await store.effect_attempts(accepted.command_id) == []


async def test_a_request_built_for_other_pins_or_none_is_refused(store: WorkStore) -> None:
    command_id, item = await _claimed(store)
    assert item.fence is not None
    elsewhere = attrs.evolve(attempt(command_id),
                             pins=attrs.evolve(dispatch_pins(), remote_id="r-other"))
    with pytest.raises(DispatchRefused) as differ:
        await store.effect_checkpoint(item.fence, elsewhere, lambda: LATER)
    assert differ.value.code == "dispatch_pins_differ"
    with pytest.raises(DispatchRefused) as unpinned:
        await store.effect_checkpoint(item.fence, attrs.evolve(attempt(command_id), pins=None),
                                      lambda: LATER)
    assert unpinned.value.code == "dispatch_unpinned"
    assert await store.effect_attempts(command_id) == []


async def test_a_moved_pin_refuses_only_its_own_request_in_a_batch(store: WorkStore) -> None:
    moved_id, moved = await _claimed(store, "lead-1")
    kept_id, kept = await _claimed(store, "lead-2")
    assert moved.fence is not None and kept.fence is not None
    await _retire(store)  # lead-1's link only
    answers = await store.effect_checkpoint_many(
        [(moved.fence, attempt(moved_id, "lead-1")), (kept.fence, attempt(kept_id, "lead-2"))],
        lambda: LATER)
    assert isinstance(answers[0], DispatchRefused) and answers[0].code == "link_inactive"
    assert isinstance(answers[1], str)
    assert await store.effect_attempts(moved_id) == []
    assert [a.attempt_id for a in await store.effect_attempts(kept_id)] == [answers[1]]
    # The link the refusal names is lead-1's, in the targets' scope.
    link = await store.link_get(TARGETS_SCOPE_DIGEST, "lead", "lead-1")
    assert link is not None and link.state.value == "retired"
