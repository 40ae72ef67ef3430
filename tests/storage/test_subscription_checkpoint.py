"""The pinned checkpoint of a subscription step (storage.effects.insert_attempt_pinned), on
every backend: the binding generation and the unresolved-attempt rule are in the INSERT
itself, judged by its affected rows (design section 11: "pins live in the statement");
and the last-run read model the console and the CLI show."""

from __future__ import annotations

import pytest

from daemon.core.outcomes import DeadLetter, RetryLater, Succeeded
from daemon.core.principals import BindingEvent, BindingIdentity, PrincipalKind, connect
from daemon.core.work import Fence
from storage.effect_values import AttemptDraft, Disposition, Kin
from storage.effects import (
    attempts_of,
    dispose,
    insert_attempt_pinned,
    record_outcome,
    unresolved_of_kin,
)
from storage.port import ReplayParams, SqlTx
from storage.principals import Actor
from storage.subscriptions import LastItem, last_items
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, claim, enqueue, finalize

WHO = Actor("op", "admin", "test")


async def _setup(store: WorkStore) -> Fence:
    facts = connect(binding_id="b", kind=PrincipalKind.SHARED, org_id="o",
                    app_installation_id="i", provider="p",
                    identity=BindingIdentity(issuer="x", remote_account_id="a",
                                             remote_subject="s"))
    await store.binding_connect(facts, WHO, T0)
    await enqueue(store, 1)
    (item,) = (await claim(store)).claimed
    assert item.fence is not None
    return item.fence


def _draft(fence: Fence) -> AttemptDraft:
    return AttemptDraft(command_id=fence.work_id, method="POST", target_path="/hooks",
                        safe_headers="{}", body_sha256="sha256:x", idempotency_key="k",
                        pre_dispatch_evidence="{}", give_up_after_us=SEC)


async def _insert(store: WorkStore, fence: Fence, attempt_id: str,
                  generation: int | None) -> bool:
    async def body(tx: SqlTx) -> bool:
        return await insert_attempt_pinned(tx, attempt_id, fence, _draft(fence), T0,
                                           binding_id="b", binding_generation=generation)

    inserted: bool = await store.work_fenced(fence, lambda: T0, body, name="t")
    return inserted


async def _attempts(store: WorkStore, fence: Fence) -> list[str]:
    async def body(tx: SqlTx) -> list[str]:
        return [a.attempt_id for a in await attempts_of(tx, fence.work_id)]

    return await store.db.transact(body, name="t", write=False)


@pytest.mark.parametrize(("generation", "inserted"), [(1, True), (2, False), (0, False),
                                                      (None, True)])
async def test_the_checkpoint_is_written_only_at_the_pinned_generation(
        store: WorkStore, generation: int | None, inserted: bool) -> None:
    fence = await _setup(store)
    assert await _insert(store, fence, "a1", generation) is inserted
    assert await _attempts(store, fence) == (["a1"] if inserted else [])


async def test_a_reconnect_or_a_disconnect_refuses_the_checkpoint_of_the_old_generation(
        store: WorkStore) -> None:
    fence = await _setup(store)
    await store.binding_transition("b", BindingEvent.DISCONNECT, WHO, expected_generation=1,
                                   now_us=T0)
    assert await _insert(store, fence, "a1", 1) is False  # disconnected
    await store.binding_transition("b", BindingEvent.RECONNECT, WHO, expected_generation=1,
                                   now_us=T0)
    assert await _insert(store, fence, "a2", 1) is False  # reconnected: generation 2
    assert await _insert(store, fence, "a3", 2) is True
    assert await _attempts(store, fence) == ["a3"]


async def test_no_second_checkpoint_while_an_attempt_is_unresolved(store: WorkStore) -> None:
    fence = await _setup(store)
    assert await _insert(store, fence, "a1", 1)
    assert await _insert(store, fence, "a2", 1) is False  # a1 has no outcome yet

    async def unknown(tx: SqlTx) -> None:
        await record_outcome(tx, "a1", outcome="OUTCOME_UNKNOWN", evidence="maybe_applied",
                             response_status=None, provider_evidence={},
                             failure_class="ReadTimeout", gave_up_at_us=T0, now_us=T0)

    await store.db.transact(unknown, name="t")
    assert await _insert(store, fence, "a2", 1) is False  # still in doubt
    assert await _insert(store, fence, "a2", None) is False  # whatever the credential

    async def absent(tx: SqlTx) -> None:
        await dispose(tx, ["a1"], Disposition.PROVEN_ABSENT, "read back", "t", T0)

    await store.db.transact(absent, name="t")
    # The next claim of the step (one attempt per claim epoch) may send again.
    item = await store.work_get(fence.work_id)
    assert item is not None and item.fence == fence
    await finalize(store, item, RetryLater("outcome_unknown"), now=T0)
    (again,) = (await claim(store, now=T0 + 120 * SEC)).claimed
    assert again.fence is not None and again.fence.ownership_epoch > fence.ownership_epoch
    assert await _insert(store, again.fence, "a2", 1) is True
    assert await _attempts(store, fence) == ["a1", "a2"]


async def test_an_unresolved_attempt_of_a_dead_kin_item_refuses_the_next_ones_checkpoint(
        store: WorkStore) -> None:
    """Issue 22: the per-step rule alone let a new create step of a subscription send while
    the dead previous step's attempt was in doubt. With its kin named, the INSERT refuses
    while any kin item (same family, subject, lane, key prefix) has an unresolved attempt,
    whatever state that item is in; another subject's, or a non-kin key's, does not."""
    kin = Kin(family="subs", subject_kind="subscription", subject_id="s1", lane="subs:b",
              key_prefix="subs:create:b:")
    await _setup(store)

    async def step(key: str, attempt_id: str, *, subject: str = "s1",
                   with_kin: bool = True) -> bool:
        """One step of the lane: claimed, its checkpoint tried, then dead (the lane goes
        on; its attempt, if written, stays unresolved)."""
        await enqueue(store, 1, family="subs", subject_kind="subscription",
                      subject_id=subject, source_lane="subs:b", dedupe_key=key)
        (item,) = (await claim(store, family="subs")).claimed
        assert item.fence is not None
        fence = item.fence

        async def body(tx: SqlTx) -> bool:
            return await insert_attempt_pinned(tx, attempt_id, fence, _draft(fence), T0,
                                               binding_id="b", binding_generation=1,
                                               kin=kin if with_kin else None)

        inserted: bool = await store.work_fenced(fence, lambda: T0, body, name="t")
        await finalize(store, item, DeadLetter("attempts_exhausted", "outcome unknown"))
        return inserted

    assert await step("subs:create:b:s1:1:run1", "a1")
    assert await step("subs:create:b:s1:1:run2", "a2") is False, (
        "sent beside the dead step's unknown attempt")

    async def kin_of(tx: SqlTx) -> list[str]:
        return [a.attempt_id for a in await unresolved_of_kin(tx, kin)]

    assert await store.db.transact(kin_of, name="t", write=False) == ["a1"]
    # Not its kin: another subject's step, a step outside the key prefix.
    assert await step("subs:create:b:s2:1:run2", "a3", subject="s2", with_kin=False)
    assert await step("subs:delete:b:s1:1:run2", "a4", with_kin=False)
    assert await store.db.transact(kin_of, name="t", write=False) == ["a1"]

    async def absent(tx: SqlTx) -> None:
        await dispose(tx, ["a1"], Disposition.PROVEN_ABSENT, "read back", "t", T0)

    await store.db.transact(absent, name="t")
    assert await step("subs:create:b:s1:1:run3", "a5") is True
    assert await store.db.transact(kin_of, name="t", write=False) == ["a5"]


async def test_an_unresolved_attempt_of_a_replayed_kin_item_refuses_the_next_ones_checkpoint(
        store: WorkStore) -> None:
    """Simulation seed 35 (issue 24's merges): an operator replayed a dead create step; the
    replay (a new item with ``replay_of`` and no dedupe key) ran out of attempts with its
    last create in doubt, and the next reconcile run's create step sent 100 ms later: the
    kin clause matched kin by dedupe-key prefix only, and a replay has no key. A replay
    of the kin's family, subject and lane is kin too."""
    kin = Kin(family="subs", subject_kind="subscription", subject_id="s1", lane="subs:b",
              key_prefix="subs:create:b:")
    await _setup(store)

    async def checkpoint(item_fence: Fence, attempt_id: str) -> bool:
        async def body(tx: SqlTx) -> bool:
            return await insert_attempt_pinned(tx, attempt_id, item_fence, _draft(item_fence),
                                               T0, binding_id="b", binding_generation=1,
                                               kin=kin)

        return bool(await store.work_fenced(item_fence, lambda: T0, body, name="t"))

    async def run_dead(attempt_id: str) -> str:
        """Claim the lane's next item, write its checkpoint, leave it dead (its attempt
        stays unresolved): the item's id."""
        (item,) = (await claim(store, family="subs")).claimed
        assert item.fence is not None
        assert await checkpoint(item.fence, attempt_id)
        await finalize(store, item, DeadLetter("attempts_exhausted", "outcome unknown"))
        return item.work_id

    await enqueue(store, 1, family="subs", subject_kind="subscription", subject_id="s1",
                  source_lane="subs:b", dedupe_key="subs:create:b:s1:1:run1")
    first = await run_dead("a1")

    async def absent(tx: SqlTx) -> None:
        await dispose(tx, ["a1"], Disposition.PROVEN_ABSENT, "read back", "t", T0)

    await store.db.transact(absent, name="t")
    replay = await store.work_replay(
        ReplayParams(work_id=first, actor="op", role="admin", reason="t"), T0)
    assert replay.dedupe_key is None and replay.replay_of == first
    assert await run_dead("a2") == replay.work_id

    async def kin_of(tx: SqlTx) -> list[str]:
        return [a.attempt_id for a in await unresolved_of_kin(tx, kin)]

    assert await store.db.transact(kin_of, name="t", write=False) == ["a2"]
    await enqueue(store, 1, family="subs", subject_kind="subscription", subject_id="s1",
                  source_lane="subs:b", dedupe_key="subs:create:b:s1:1:run2")
    (step,) = (await claim(store, family="subs")).claimed
    assert step.fence is not None
    assert await checkpoint(step.fence, "a3") is False, (
        "sent beside the replayed step's unknown attempt")


async def test_the_last_item_of_each_subject_is_the_newest_that_ran(store: WorkStore) -> None:
    """The console's and the CLI's "last run" / "last step" (storage.subscriptions
    .last_items): the newest item of the family per subject that is not merely queued."""
    ran = await enqueue(store, 1, family="subs", subject_id="b1", now=T0)
    (item,) = (await claim(store, family="subs", now=T0)).claimed
    await finalize(store, item, DeadLetter("list_unavailable", "did not answer 200 (401)"),
                   now=T0 + SEC)
    await enqueue(store, 1, family="subs", subject_id="b1", now=T0 + 2 * SEC)  # only queued
    await enqueue(store, 1, family="other", subject_id="b1", now=T0 + 3 * SEC)
    (other,) = (await claim(store, family="other", now=T0 + 3 * SEC)).claimed
    await finalize(store, other, Succeeded("not ours"), now=T0 + 4 * SEC)

    async def body(tx: SqlTx) -> dict[str, LastItem]:
        return await last_items(tx, "subs", ["b1", "nobody"])

    last = await store.db.transact(body, name="t", write=False)
    assert list(last) == ["b1"]
    got = last["b1"]
    assert (got.work_id, got.state, got.failure_class, got.summary) == (
        ran[0], "dead", "list_unavailable", "did not answer 200 (401)")
