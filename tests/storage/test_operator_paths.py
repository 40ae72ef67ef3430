"""Conformance: every operator path from every effect state ends in exactly one true
Runtime receipt or is refused with the one action that does (issue 20 items 3, 5, 6),
on every backend."""

from __future__ import annotations

import attrs
import pytest
import trio

from daemon.core.outcomes import DeadLetter
from daemon.core.work import WorkItem
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.command_repair import RepairActor
from storage.effect_values import Disposition, Settlement
from storage.port import ReplayParams, StorageError, WorkConflict, WorkQuery
from storage.work_store import WorkStore
from tests.storage.test_effect_journal import attempt, record
from tests.support.backends import FreshDatabase
from tests.support.commands import HUBSPOT_MAIN, draft, publish_test_revision
from tests.support.work import SEC, T0, claim, finalize

WHO = RepairActor(actor="otto", role="operator", reason="operator path")
LATER = T0 + 120 * SEC  # past every in-flight window used here
CATALOG = (7, "sha256:catalog")


async def _setup(store: WorkStore) -> None:
    await publish_test_revision(store)
    await store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN), T0)


async def _accept(store: WorkStore, lead: str, *, intent: str | None = None,
                  title: str = "CTO", now: int = T0) -> str:
    """An UPSERT of the lead's job title, pinned to its (existing) remote link."""
    link = await store.link_get("c" * 64, "lead", lead)
    if link is None:
        link = await store.link_adopt("c" * 64, "lead", lead, "contact", f"r-{lead}",
                                      actor="t", role="admin", reason="seed", now_us=T0)
    result = await store.command_accept(
        attrs.evolve(draft(intent or f"int-{lead}", lead=lead, title=title),
                     link_key=link.link_key), now)
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
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id), now)
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
