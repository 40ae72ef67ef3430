"""Conformance: every operator path from every effect state ends in exactly one true
Runtime receipt or is refused with the one action that does (issue 20 items 3, 5, 6),
on every backend."""

from __future__ import annotations

import itertools

import pytest
import trio

from daemon.core.operator_paths import (
    Action,
    Allowed,
    CommandFacts,
    EffectState,
    Receipt,
    Refused,
    advice,
    verdict,
)
from daemon.core.outcomes import DeadLetter
from daemon.core.work import WorkItem
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.command_repair import RepairActor
from storage.effect_values import Disposition, Settlement
from storage.operator_refusal import ActionRefused
from storage.port import CancelParams, ReplayParams, SqlTx, StorageError, WorkConflict, WorkQuery
from storage.work_admin import CancelRefused
from storage.work_store import WorkStore
from tests.storage.test_effect_journal import record
from tests.support.backends import FreshDatabase
from tests.support.commands import (
    HUBSPOT_MAIN,
    TARGETS_SCOPE_DIGEST,
    accept_pinned,
    attempt,
    draft,
    pinned,
    publish_test_revision,
    target_remote,
)
from tests.support.work import SEC, T0, claim, finalize

WHO = RepairActor(actor="otto", role="operator", reason="operator path")
LATER = T0 + 120 * SEC  # past every in-flight window used here
CATALOG = (7, "sha256:catalog")


async def _setup(store: WorkStore) -> None:
    await publish_test_revision(store)
    await store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN), T0)


async def _accept(store: WorkStore, lead: str, *, intent: str | None = None,
                  title: str = "CTO", now: int = T0, set_up: bool = False) -> str:
    """An UPSERT of the lead's job title, every pin real and current (its remote link
    r-LEAD among them: tests.support.commands.accept_pinned). ``set_up``: the store's
    binding and Catalog revision are already what :func:`_setup` made them (which
    ``accept_pinned`` would bootstrap and publish again, idempotently), so only the lead's
    link is adopted."""
    d = draft(intent or f"int-{lead}", lead=lead, title=title)
    if set_up:
        await store.link_adopt(TARGETS_SCOPE_DIGEST, "lead", lead, "contact",
                               target_remote(lead), actor="test", role="admin",
                               reason="test setup", now_us=now)
        result = await store.command_accept(pinned(d), now)
    else:
        result = await accept_pinned(store, d, now)
    assert result.command_id is not None
    return result.command_id


async def _work_of(store: WorkStore, command_id: str) -> WorkItem:
    """The command's newest work item."""
    items = await store.work_list(WorkQuery(family="external_effect", subject_id=command_id))
    return items[0]


async def _dead_after(store: WorkStore, command_id: str, *, outcome: str,
                      evidence: str = "maybe_applied", now: int = T0) -> str:
    """Claim the command's work, make one attempt with ``outcome``, let the item die;
    the attempt id."""
    work = await _work_of(store, command_id)
    (item,) = (await claim(store, family="external_effect", now=now)).claimed
    assert item.work_id == work.work_id and item.fence is not None
    command = await store.command_get(command_id)
    assert command is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id, command.local_id),
                                               lambda: now)
    await record(store, item.fence, attempt_id, now, outcome=outcome,
                 status=None if outcome == "OUTCOME_UNKNOWN" else 503,
                 failure_class="transport", effect_evidence=evidence)
    await finalize(store, item, DeadLetter(outcome.lower(), "operator needed"), now=now)
    return attempt_id


async def _dispose(store: WorkStore, attempt_id: str, disposition: Disposition,
                   now: int = LATER) -> None:
    await store.effect_operator_disposition(
        attempt_id=attempt_id, disposition=disposition, note="seen at the provider",
        actor="otto", role="operator", in_flight_window_us=30 * SEC, now_us=now)


async def _replay(store: WorkStore, work_id: str) -> WorkItem:
    return await store.work_replay(ReplayParams(work_id=work_id, actor="otto", role="operator",
                                                reason="again", resolved_catalog=CATALOG),
                                   LATER)


async def _applied_dead(store: WorkStore, lead: str = "lead-1") -> tuple[str, str]:
    """Issue 20 item 3 as found from outside: a PATCH applied, its read-back blocked, the
    item dead; the operator records the disposition ``applied``."""
    await _setup(store)
    command_id = await _accept(store, lead)
    attempt_id = await _dead_after(store, command_id, outcome="OUTCOME_UNKNOWN")
    await _dispose(store, attempt_id, Disposition.OPERATOR_APPLIED)
    return command_id, attempt_id


# ------------------------------------------------------------------ findings


async def test_no_intent_is_stranded_a_retire_after_an_applied_disposition_settles_success(
    store: WorkStore,
) -> None:
    command_id, _ = await _applied_dead(store)
    settlement = await store.command_retire(command_id, WHO, receipt_max_attempts=5,
                                            now_us=LATER)
    assert settlement is Settlement.SUCCEEDED
    receipt = await store.receipt_get(command_id)
    assert receipt is not None
    assert (receipt.result_format_version, receipt.remote_id) == (1, "r-lead-1")


async def test_a_replay_of_a_retired_command_is_refused_not_accepted_and_skipped(
    store: WorkStore,
) -> None:
    await _setup(store)
    command_id = await _accept(store, "lead-1")
    await _dead_after(store, command_id, outcome="REPLAY_SAFE_RETRY")  # maybe applied
    assert await store.command_retire(command_id, WHO, receipt_max_attempts=5,
                                      now_us=LATER) is Settlement.RETIRED
    dead = await _work_of(store, command_id)
    with pytest.raises(WorkConflict, match="retired"):
        await _replay(store, dead.work_id)
    assert await store.work_replays_of(dead.work_id) == []


async def test_a_replay_of_a_repaired_command_is_refused(store: WorkStore) -> None:
    await _setup(store)
    command_id = await _accept(store, "lead-1")
    await _dead_after(store, command_id, outcome="REPLAY_SAFE_RETRY")
    await store.command_repair(command_id, WHO, binding_generation=1, catalog_revision=7,
                               catalog_digest="sha256:catalog", max_attempts=8, now_us=LATER)
    dead = (await store.work_list(WorkQuery(family="external_effect", subject_id=command_id,
                                            state=None)))[0]
    with pytest.raises(WorkConflict, match="repaired"):
        await _replay(store, dead.work_id)


async def test_a_replay_of_an_older_intent_while_a_newer_one_is_open_is_refused(
    store: WorkStore,
) -> None:
    """Issue 20 item 5: the old Title replayed while a newer Title for the same record is
    still open would run after it (a new sequence at the tail of the lane) and win."""
    await _setup(store)
    old = await _accept(store, "lead-1", intent="int-old", title="Old")
    await _dead_after(store, old, outcome="REPLAY_SAFE_RETRY", evidence="not_applied")
    await _accept(store, "lead-1", intent="int-new", title="New", now=T0 + SEC)  # open
    dead = await _work_of(store, old)
    with pytest.raises(WorkConflict, match="newer intent"):
        await _replay(store, dead.work_id)
    assert await store.work_replays_of(dead.work_id) == []


async def test_the_replay_guard_is_in_the_replay_transaction_racing_a_retire_one_wins(
    database: FreshDatabase,
) -> None:
    """Issue 20 item 6: the guard read the command before the replay's transaction; a
    retire committed in between left a replayed item of a retired command. Run as a race
    between two stores (on Galera, two nodes): exactly one of them wins."""
    first, second = [await database.open_store(pool_size=2) for _ in range(2)]
    await _setup(first)
    command_id = await _accept(first, "lead-1")
    await _dead_after(first, command_id, outcome="REPLAY_SAFE_RETRY", evidence="not_applied")
    dead = await _work_of(first, command_id)
    won: dict[str, object] = {}

    async def replay() -> None:
        try:
            won["replay"] = await _replay(first, dead.work_id)
        except WorkConflict as exc:
            won["replay_refused"] = exc

    async def retire() -> None:
        try:
            won["retire"] = await second.command_retire(command_id, WHO,
                                                        receipt_max_attempts=5, now_us=LATER)
        except WorkConflict as exc:
            won["retire_refused"] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(replay)
        nursery.start_soon(retire)
    assert ("replay" in won) != ("retire" in won), won
    command = await first.command_get(command_id)
    assert command is not None
    if "replay" in won:
        assert command.settlement is Settlement.OPEN
    else:
        assert await first.work_replays_of(dead.work_id) == []


async def test_concurrent_replays_of_one_item_have_one_winner(database: FreshDatabase) -> None:
    stores = [await database.open_store(pool_size=2) for _ in range(3)]
    await _setup(stores[0])
    command_id = await _accept(stores[0], "lead-1")
    await _dead_after(stores[0], command_id, outcome="REPLAY_SAFE_RETRY",
                      evidence="not_applied")
    dead = await _work_of(stores[0], command_id)
    results: list[object] = []

    async def replay(store: WorkStore) -> None:
        try:
            results.append(await _replay(store, dead.work_id))
        except (WorkConflict, StorageError) as exc:
            results.append(exc)

    async with trio.open_nursery() as nursery:
        for store in stores:
            nursery.start_soon(replay, store)
    winners = [r for r in results if isinstance(r, WorkItem)]
    assert len(winners) == 1, results
    assert all(isinstance(r, WorkConflict) for r in results if r not in winners), results
    assert len(await stores[0].work_replays_of(dead.work_id)) == 1


# ------------------------------------------------ every path from every effect state
#
# Each path starts a command of its own record in one effect state, performs a
# sequence of operator actions through the real store methods, and walks the
# operator-path table beside it: the store must allow exactly what the table allows
# (refusing with the table's code where the table decides), leave the state the table
# names, write nothing when it refuses, and leave at most one receipt, true to what
# happened at the provider. Then the table's advice is followed to the end: it is
# never refused.

async def _build(store: WorkStore, state: EffectState, lead: str) -> tuple[str, bool]:
    """A command of ``lead`` in ``state`` (on a store :func:`_setup` set up); and whether
    its effect was applied."""
    command_id = await _accept(store, lead, set_up=True)
    if state is EffectState.RUNNING:
        return command_id, False
    if state in (EffectState.UNPROVEN, EffectState.RETIRED):
        await _dead_after(store, command_id, outcome="REPLAY_SAFE_RETRY")
        if state is EffectState.RETIRED:
            await store.command_retire(command_id, WHO, receipt_max_attempts=5, now_us=LATER)
        return command_id, False
    attempt_id = await _dead_after(store, command_id, outcome="OUTCOME_UNKNOWN")
    if state is EffectState.UNRESOLVED:
        return command_id, False
    applied = state in (EffectState.APPLIED, EffectState.RETIRED_APPLIED)
    await _dispose(store, attempt_id, Disposition.OPERATOR_APPLIED if applied
                   else Disposition.OPERATOR_ABSENT)
    if state is EffectState.RETIRED_APPLIED:  # as an earlier build left it
        async def retired(tx: SqlTx) -> None:
            await tx.execute("UPDATE external_commands SET settlement = 'retired'"
                             " WHERE command_id = ?", (command_id,))

        await store.db.transact(retired, name="test.retire_as_before")
    elif state is EffectState.REPAIRED:
        await _repair(store, command_id, LATER)
    elif state is EffectState.ANSWERED:
        await store.command_retire(command_id, WHO, receipt_max_attempts=5, now_us=LATER)
    return command_id, applied


async def _repair(store: WorkStore, command_id: str, now: int) -> str:
    return await store.command_repair(command_id, WHO, binding_generation=1,
                                      catalog_revision=7, catalog_digest="sha256:catalog",
                                      max_attempts=8, now_us=now)


async def _perform(store: WorkStore, command_id: str, action: Action, now: int) -> None:
    """``action`` through the store method an operator's request reaches."""
    if action in (Action.DISPOSE_APPLIED, Action.DISPOSE_ABSENT):
        attempts = await store.effect_attempts(command_id)
        if not attempts:
            raise WorkConflict("no attempt to dispose")
        await _dispose(store, attempts[-1].attempt_id,
                       Disposition.OPERATOR_APPLIED if action is Action.DISPOSE_APPLIED
                       else Disposition.OPERATOR_ABSENT, now)
    elif action is Action.RETIRE:
        await store.command_retire(command_id, WHO, receipt_max_attempts=5, now_us=now)
    elif action is Action.REPAIR:
        await _repair(store, command_id, now)
    elif action is Action.REPLAY:
        item = await _work_of(store, command_id)
        await store.work_replay(ReplayParams(work_id=item.work_id, actor="otto",
                                             role="operator", reason="again",
                                             resolved_catalog=CATALOG), now)
    else:
        item = await _work_of(store, command_id)
        await store.work_cancel_audited(CancelParams(work_id=item.work_id, actor="otto",
                                                     role="operator", reason="stop"), now)


async def _refusal(store: WorkStore, command_id: str, action: Action,
                   now: int) -> WorkConflict | None:
    """Perform ``action``; the refusal, if it was refused."""
    try:
        await _perform(store, command_id, action, now)
    except WorkConflict as exc:
        return exc
    return None


async def _snapshot(store: WorkStore, command_id: str
                    ) -> tuple[tuple[object, ...], EffectState, CommandFacts]:
    """What an operator sees of the command (to show a refusal wrote nothing), and its
    effect state and facts as the same read found them."""
    path = await store.command_operator_path(command_id, CATALOG)
    assert path is not None
    items = await store.work_list(WorkQuery(subject_id=command_id))
    seen = (path.as_json(), path.command.settlement, await store.receipt_get(command_id),
            len(await store.audit_list(target_id=command_id)),
            sorted((i.work_id, i.state.value) for i in items))
    return seen, EffectState(path.state), path.facts


async def _state(store: WorkStore, command_id: str) -> tuple[EffectState, CommandFacts]:
    path = await store.command_operator_path(command_id, CATALOG)
    assert path is not None
    return EffectState(path.state), path.facts


# Where the table decides in the store (the disposition and the cancel keep their own
# rules, which must agree on what is allowed).
_TABLE_CODED = (Action.RETIRE, Action.REPAIR, Action.REPLAY)
_ACTIONS = [a for a in Action if a is not Action.DISPOSE]
_STARTS = [s for s in EffectState]


async def _walk(store: WorkStore, state: EffectState, actions: tuple[Action, ...],
                lead: str) -> None:
    command_id, applied = await _build(store, state, lead)
    now = LATER + SEC
    seen, facts = await _state(store, command_id)
    assert seen is state
    # What the store showed when nothing has been written since (after a refusal, which
    # is proved to write nothing): the next refusal is compared with it, unread again.
    unchanged: tuple[object, ...] | None = None
    for action in actions:
        now += SEC
        expected = verdict(facts, action)
        # Only an expected refusal compares the store before and after: an action the
        # table allows fails the walk whichever way the store refuses it.
        before = None
        if isinstance(expected, Refused):
            before = (unchanged if unchanged is not None
                      else (await _snapshot(store, command_id))[0])
        refusal = await _refusal(store, command_id, action, now)
        if refusal is not None:
            assert isinstance(expected, Refused), (state, actions, action, refusal)
            if action in _TABLE_CODED:
                assert isinstance(refusal, ActionRefused), (state, actions, action, refusal)
                assert (refusal.code, refusal.instead) == (expected.code, expected.instead)
            if isinstance(refusal, CancelRefused):
                assert refusal.code == expected.code
            after, seen, facts = await _snapshot(store, command_id)
            assert after == before  # a refusal writes nothing
            unchanged = after
        else:
            assert isinstance(expected, Allowed), (state, actions, action, expected)
            unchanged = None
            if action is Action.DISPOSE_APPLIED:
                applied = True
            seen, facts = await _state(store, command_id)
            if expected.then is not None:
                assert seen is expected.then, (state, actions, action)
            receipt = await store.receipt_get(command_id)
            if expected.receipt is Receipt.SUCCESS:
                assert receipt is not None and receipt.result_format_version == 1
                assert receipt.remote_id == f"r-{lead}"
            elif expected.receipt is Receipt.NO_EFFECT:
                assert receipt is not None and receipt.result_format_version == 2
    # Exactly the receipt the truth allows, once, for the intent the Runtime knows.
    receipt = await store.receipt_get(command_id)
    if receipt is not None:
        assert receipt.result_format_version == (1 if applied else 2), (state, actions)
    # Follow the advice: it is never refused, and it ends in a receipt or in running
    # work whose own result is the receipt.
    for _ in range(4):
        advised = advice(facts)
        if advised is None:
            break
        if advised is Action.DISPOSE:
            advised = Action.DISPOSE_APPLIED if applied else Action.DISPOSE_ABSENT
        now += SEC
        await _perform(store, command_id, advised, now)  # raises if refused
        seen, facts = await _state(store, command_id)
    assert seen in (EffectState.ANSWERED, EffectState.RUNNING, EffectState.REPAIRED), (
        state, actions, seen)
    receipt = await store.receipt_get(command_id)
    if seen is EffectState.ANSWERED:
        assert receipt is not None
        assert receipt.result_format_version == (1 if applied else 2), (state, actions)
    else:
        assert receipt is None


@pytest.mark.parametrize("start", _STARTS, ids=[s.value for s in _STARTS])
async def test_every_operator_path_from_every_effect_state_ends_in_one_true_receipt(
    store: WorkStore, start: EffectState,
) -> None:
    await _setup(store)
    paths = [(a,) for a in _ACTIONS] + list(itertools.product(_ACTIONS, repeat=2))
    for n, actions in enumerate(paths):
        await _walk(store, start, actions, f"lead-{start.value}-{n}")
