"""Conformance: the command inbox and its handoff fence (seed 6.1), on every backend."""

from __future__ import annotations

import trio

from storage.effect_values import Admission, AdmissionResult, CommandDraft, Settlement
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


async def test_accept_many_answers_each_draft_as_accept_would(store: WorkStore) -> None:
    # Prior facts: one accepted, one rejected (tombstone).
    accepted = await store.command_accept(draft("int-a", lead="lead-a"), T0)
    tomb = draft("int-t", lead="lead-t")
    await store.command_reject_if_unaccepted(
        scope=SCOPE, runtime_name="crm", handoff_key=tomb.handoff_key,
        payload_digest=tomb.payload_digest, runtime_outbox_id=tomb.runtime_outbox_id,
        now_us=T0)
    batch = [
        draft("int-n1", lead="lead-1"),
        draft("int-a", lead="lead-a"),  # a resend of the accepted one
        tomb,  # a late delivery after the rejection
        draft("int-a", lead="lead-a", outbox="outbox-9"),  # same key, other outbox
        draft("int-n2", lead="lead-1"),  # same Lead: next in its source lane
        draft("int-n1", lead="lead-1"),  # repeated inside the batch
    ]
    answers = await store.command_accept_many(batch, T0 + 10)
    assert [a.admission for a in answers] == [
        Admission.COMMAND_ACCEPTED, Admission.COMMAND_ACCEPTED, Admission.HANDOFF_REJECTED,
        Admission.QUARANTINED, Admission.COMMAND_ACCEPTED, Admission.COMMAND_ACCEPTED]
    assert [a.created for a in answers] == [True, False, False, False, True, False]
    assert answers[1].command_id == accepted.command_id
    assert answers[5].command_id == answers[0].command_id
    assert answers[3].command_id is None  # nothing disclosed
    assert await store.quarantine_count(batch[3].handoff_key) == 1
    items = {i.subject_id: i for i in await store.work_list(WorkQuery(family="external_effect"))}
    assert set(items) == {accepted.command_id, answers[0].command_id, answers[4].command_id}
    first, second = (items[str(answers[0].command_id)], items[str(answers[4].command_id)])
    assert first.source_lane == second.source_lane == "org-1:lead:lead-1"
    assert first.source_seq is not None and second.source_seq == first.source_seq + 1


async def test_accept_many_fresh_batch_is_one_transaction(store: WorkStore) -> None:
    batch = [draft(f"int-{i}", lead=f"lead-{i % 3}") for i in range(9)]
    commits = store.db.stats.commits
    answers = await store.command_accept_many(batch, T0)
    assert store.db.stats.commits == commits + 1
    assert all(a.created and a.admission is Admission.COMMAND_ACCEPTED for a in answers)
    assert len({a.command_id for a in answers}) == 9
    by_lane: dict[str, list[int]] = {}
    for item in await store.work_list(WorkQuery(family="external_effect")):
        assert item.source_lane is not None and item.source_seq is not None
        by_lane.setdefault(item.source_lane, []).append(item.source_seq)
    assert {k: sorted(v) for k, v in by_lane.items()} == {
        f"org-1:lead:lead-{n}": [1, 2, 3] for n in range(3)}
    # A second batch over the same lanes continues each lane's sequence.
    await store.command_accept_many([draft(f"int-x{n}", lead=f"lead-{n}") for n in range(3)],
                                    T0 + 1)
    seqs = [i.source_seq for i in await store.work_list(WorkQuery(family="external_effect"))
            if i.source_lane == "org-1:lead:lead-0"]
    assert sorted(s for s in seqs if s is not None) == [1, 2, 3, 4]


async def test_accept_many_racing_rejects_has_one_outcome_per_key(
        database: FreshDatabase) -> None:
    stores = [await database.open_store(pool_size=2) for _ in range(3)]
    batch = [draft(f"int-b{i}", lead=f"lead-{i}") for i in range(6)]
    rejects: list[Admission] = []

    async def reject(store: WorkStore, d: CommandDraft) -> None:
        r = await store.command_reject_if_unaccepted(
            scope=SCOPE, runtime_name="crm", handoff_key=d.handoff_key,
            payload_digest=d.payload_digest, runtime_outbox_id=d.runtime_outbox_id, now_us=T0)
        rejects.append(r.admission)

    answers: list[AdmissionResult] = []

    async def accept_all() -> None:
        answers.extend(await stores[0].command_accept_many(batch, T0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept_all)
        for i, d in enumerate(batch[::2]):
            nursery.start_soon(reject, stores[1 + i % 2], d)
    for d, answer in zip(batch, answers, strict=True):
        found = await stores[0].admission_read(d.handoff_key)
        assert found is not None and found[1].admission is answer.admission
    accepted = {a.command_id for a in answers if a.admission is Admission.COMMAND_ACCEPTED}
    assert set(await _effect_items(stores[0])) == accepted
    assert len(rejects) == 3 and all(r in (Admission.COMMAND_ACCEPTED, Admission.HANDOFF_REJECTED)
                                     for r in rejects)
