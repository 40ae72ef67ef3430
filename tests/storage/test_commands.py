"""Conformance: the command inbox and its handoff fence (seed 6.1), on every backend."""

from __future__ import annotations

import trio

from storage.effect_values import Admission, Settlement
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.commands import SCOPE, draft
from tests.support.work import T0


async def _effect_items(store: WorkStore) -> list[str]:
    return [i.subject_id for i in await store.work_list(WorkQuery(family="external_effect"))]


async def test_accept_writes_fact_command_and_one_work_item(store: WorkStore) -> None:
    first = await store.command_accept(draft(), T0)
    assert first.admission is Admission.COMMAND_ACCEPTED and first.created
    assert first.command_id is not None and first.work_id is not None
    again = await store.command_accept(draft(), T0 + 1)  # a lost response, resent
    assert (again.admission, again.command_id, again.created) == (
        Admission.COMMAND_ACCEPTED, first.command_id, False)
    assert await _effect_items(store) == [first.command_id]
    command = await store.command_get(first.command_id)
    assert command is not None
    assert (command.scope, command.intent_id, command.settlement) == (SCOPE, "int-1",
                                                                      Settlement.OPEN)
    assert (command.binding_id, command.binding_generation) == ("hubspot-main", 1)
    item = await store.work_get(first.work_id)
    assert item is not None and item.source_lane == "org-1:lead:lead-1"


async def test_a_different_digest_or_outbox_is_quarantined(store: WorkStore) -> None:
    accepted = await store.command_accept(draft(), T0)
    for variant in (draft(title="CEO"), draft(outbox="outbox-2")):
        result = await store.command_accept(variant, T0)
        assert result.admission is Admission.QUARANTINED
        assert result.command_id is None  # nothing disclosed
        rejected = await store.command_reject_if_unaccepted(
            scope=SCOPE, runtime_name="crm", handoff_key=variant.handoff_key,
            payload_digest=variant.payload_digest, runtime_outbox_id=variant.runtime_outbox_id,
            now_us=T0)
        assert rejected.admission is Admission.QUARANTINED
    accepted_key = draft().handoff_key
    assert await store.quarantine_count(accepted_key) == 4
    found = await store.admission_read(accepted_key)
    assert found is not None and found[1].command_id == accepted.command_id
    assert len(await _effect_items(store)) == 1


async def test_reject_if_unaccepted_writes_a_durable_tombstone(store: WorkStore) -> None:
    d = draft()
    args = {"scope": SCOPE, "runtime_name": "crm", "handoff_key": d.handoff_key,
            "payload_digest": d.payload_digest, "runtime_outbox_id": d.runtime_outbox_id}
    assert await store.admission_read(d.handoff_key) is None  # nothing is not a rejection
    tomb = await store.command_reject_if_unaccepted(**args, now_us=T0)  # type: ignore[arg-type]
    assert tomb.admission is Admission.HANDOFF_REJECTED and tomb.created
    again = await store.command_reject_if_unaccepted(**args, now_us=T0 + 5)  # type: ignore[arg-type]
    assert again.receipt == tomb.receipt and not again.created  # idempotent, same receipt
    late = await store.command_accept(d, T0 + 10)
    assert late.admission is Admission.HANDOFF_REJECTED
    assert late.command_id is None
    assert await _effect_items(store) == []


async def test_reject_after_accept_returns_the_accepted_command(store: WorkStore) -> None:
    d = draft()
    accepted = await store.command_accept(d, T0)
    result = await store.command_reject_if_unaccepted(
        scope=SCOPE, runtime_name="crm", handoff_key=d.handoff_key,
        payload_digest=d.payload_digest, runtime_outbox_id=d.runtime_outbox_id, now_us=T0)
    assert (result.admission, result.command_id) == (Admission.COMMAND_ACCEPTED,
                                                     accepted.command_id)


async def test_accept_racing_reject_has_exactly_one_outcome(database: FreshDatabase) -> None:
    stores = [await database.open_store(pool_size=2) for _ in range(4)]
    for trial in range(12):
        d = draft(f"int-race-{trial}", lead=f"lead-{trial}")
        answers: list[tuple[str, Admission, str | None]] = []

        async def accept(store: WorkStore) -> None:
            r = await store.command_accept(d, T0)  # noqa: B023
            answers.append(("accept", r.admission, r.command_id))  # noqa: B023

        async def reject(store: WorkStore) -> None:
            r = await store.command_reject_if_unaccepted(
                scope=SCOPE, runtime_name="crm", handoff_key=d.handoff_key,  # noqa: B023
                payload_digest=d.payload_digest,  # noqa: B023
                runtime_outbox_id=d.runtime_outbox_id, now_us=T0)  # noqa: B023
            answers.append(("reject", r.admission, r.command_id))  # noqa: B023

        async with trio.open_nursery() as nursery:
            for i, store in enumerate(stores):
                nursery.start_soon(accept if i % 2 == 0 else reject, store)
        outcomes = {a[1] for a in answers}
        assert len(outcomes) == 1, answers  # every caller sees the same single outcome
        commands = {a[2] for a in answers}
        found = await stores[0].admission_read(d.handoff_key)
        assert found is not None
        items = [s for s in await _effect_items(stores[0]) if s in commands]
        if outcomes == {Admission.COMMAND_ACCEPTED}:
            assert len(commands) == 1 and len(items) == 1
        else:
            assert commands == {None} and items == []
