"""Conformance: every fenced write judges the WorkItem fence at the time its transaction
runs, not at a time its caller read before it, on every backend.

The caller reads its clock, then waits (for a pool connection, for the batcher's window,
or frozen) past its 10 s WorkItem lease before the write's transaction begins. A write
judged at the time read before the wait would pass the fence and record a checkpoint
(and send), an outcome, a renewal (reviving an ended lease) or a quota slot for a claim
whose lease had ended: seed 5.1, "a claimant whose lease expired can change nothing".
The refresh marker had the same flaw (simulation seeds 28, 58, 104;
``tests/storage/test_refresh_dispatch.py``); these are the other fenced writes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import pytest

from daemon.core.lost_slots import SendGate
from daemon.core.outcomes import Succeeded
from daemon.core.quota import QuotaPolicy, ReservationState
from daemon.core.retention import DAY_US, Cutoffs
from daemon.core.states import WorkState
from daemon.core.work import Fence, WorkItem
from storage.effect_values import Disposition
from storage.port import LostLease, SqlTx
from storage.quota import SlotRelease, SlotReserved
from storage.retention.prune import BatchParams, LeaseGranted, LeaseParams, RetentionLeaseLost
from storage.retention.rules import RULES
from storage.work_store import WorkStore
from tests.support.commands import accept_pinned, attempt, draft
from tests.support.retention import PAST_WORK, count
from tests.support.work import SEC, T0, claim, enqueue, finalization
from tests.support.work import finalize as finalize_item

LEASE = 10 * SEC
# What the caller's clock read before the wait, and the time when its transaction runs.
READ_BEFORE = T0 + 2 * SEC
RUNS_AT = T0 + 12 * SEC  # past the 10 s WorkItem lease
FRESH = T0 + 1  # a time within the lease, for the set-up's own fenced writes
POLICY = QuotaPolicy(limit=10, window_us=SEC, jitter_us=50_000)


@attrs.define
class Claimed:
    store: WorkStore
    item: WorkItem
    command_id: str
    lead: str
    key: str  # its own quota key
    clock: list[int]

    @property
    def fence(self) -> Fence:
        assert self.item.fence is not None
        return self.item.fence

    def now(self) -> int:
        return self.clock[0]


@contextmanager
def waits_before_its_transaction(c: Claimed) -> Iterator[None]:
    """Every transaction begins after the wait: the clock is past the lease by then."""
    inner = c.store.db.transact

    async def transact_after_a_wait(body: Any, *, name: str, write: bool = True) -> Any:
        c.clock[0] = RUNS_AT
        return await inner(body, name=name, write=write)

    c.clock[0] = READ_BEFORE
    c.store.db.transact = transact_after_a_wait  # type: ignore[method-assign]
    try:
        yield
    finally:
        c.store.db.transact = inner  # type: ignore[method-assign]


async def _claimed(store: WorkStore, n: int = 1) -> Claimed:
    """The n-th command, claimed alone (the earlier ones are still held) for 10 s at T0."""
    lead = f"lead-{n}"
    accepted = await accept_pinned(store, draft(f"int-{n}", outbox=f"outbox-{n}", lead=lead),
                                   T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect", ttl=LEASE, now=T0)).claimed
    return Claimed(store, item, accepted.command_id, lead, f"k-{n}", [FRESH])


async def _lost(write: Awaitable[Any]) -> bool:
    try:
        await write
    except LostLease:
        return True
    return False


# Each fenced write: does it, with the clock ``c.now`` (read inside its transaction after
# the fix), and says whether it was refused as a lost claim. Then ``wrote_nothing``.
async def checkpoint(c: Claimed) -> bool:
    return await _lost(c.store.effect_checkpoint(c.fence, attempt(c.command_id, c.lead), c.now))


async def checkpoint_batch(c: Claimed) -> bool:
    (answer,) = await c.store.effect_checkpoint_many([(c.fence, attempt(c.command_id, c.lead))],
                                                     c.now)
    return isinstance(answer, LostLease)


async def attempts_unchanged(c: Claimed) -> bool:
    return await c.store.effect_attempts(c.command_id) == []


async def receipt_fence(c: Claimed) -> bool:
    (answer,) = await c.store.work_fences_live([c.fence], c.now)
    return isinstance(answer, LostLease)


async def nothing(c: Claimed) -> bool:
    return True


async def dispose(c: Claimed) -> bool:
    attempt_id = await c.store.effect_checkpoint(c.fence, attempt(c.command_id, c.lead),
                                                 lambda: FRESH)
    with waits_before_its_transaction(c):
        return await _lost(c.store.effect_dispose(
            c.fence, [attempt_id], Disposition.PROVEN_ABSENT, "read back", c.now))


async def not_disposed(c: Claimed) -> bool:
    (row,) = await c.store.effect_attempts(c.command_id)
    return row.disposition is None


async def finalize(c: Claimed) -> bool:
    (result,) = await c.store.work_finalize_if_owner(
        [finalization(c.item, Succeeded(), now=READ_BEFORE)], "A", c.now)
    return not result.applied


async def still_processing(c: Claimed) -> bool:
    row = await c.store.work_get(c.item.work_id)
    return row is not None and row.state is WorkState.PROCESSING \
        and row.lease_until_us == T0 + LEASE


async def renew(c: Claimed) -> bool:
    got = await c.store.work_renew_if_owner([c.fence], LEASE, c.now)
    return got.lost == [c.fence] and got.renewed == {}


async def fenced_body(c: Claimed) -> bool:
    async def body(tx: SqlTx) -> None:
        await tx.execute("UPDATE work_items SET operator_summary = 'written'"
                         " WHERE work_id = ?", (c.item.work_id,))

    return await _lost(c.store.work_fenced(c.fence, c.now, body, name="test.fenced"))


async def summary_unwritten(c: Claimed) -> bool:
    row = await c.store.work_get(c.item.work_id)
    return row is not None and row.operator_summary != "written"


async def quota_reserve(c: Claimed) -> bool:
    return await _lost(c.store.quota_reserve(c.key, POLICY, fence=c.fence,
                                             gate=SendGate.CHECKPOINT, now=c.now))


async def no_reservation(c: Claimed) -> bool:
    return await c.store.quota_reservations(c.item.work_id) == [] \
        and await c.store.quota_keys(c.key) == []


async def _reserved(c: Claimed) -> SlotReserved:
    got = await c.store.quota_reserve(c.key, POLICY, fence=c.fence, gate=SendGate.GRANTED,
                                      now=lambda: FRESH)
    assert isinstance(got, SlotReserved)
    return got


async def quota_release(c: Claimed) -> bool:
    slot = await _reserved(c)
    with waits_before_its_transaction(c):
        return await _lost(c.store.quota_release(
            c.fence, [SlotRelease(slot.reservation_id, c.key, POLICY, slot.position_us)],
            now=c.now))


async def quota_hand_out(c: Claimed) -> bool:
    slot = await _reserved(c)
    with waits_before_its_transaction(c):
        return await _lost(c.store.quota_hand_out(c.fence, [slot.reservation_id],
                                                  now=c.now))


async def reservation_untouched(c: Claimed) -> bool:
    async def read(tx: SqlTx) -> list[tuple[Any, ...]]:
        return await tx.fetchall("SELECT state, send_gate FROM quota_reservations"
                                 " WHERE work_id = ?", (c.item.work_id,))

    rows = await c.store.db.transact(read, name="test.reservations", write=False)
    return [tuple(r) for r in rows] == [(ReservationState.RESERVED.value,
                                         SendGate.GRANTED.value)]


Write = Callable[[Claimed], Awaitable[bool]]
# (the write, what it must have left as it was); a write that sets up state of its own
# first enters ``waits_before_its_transaction`` itself.
WRITES: dict[str, tuple[Write, Write, bool]] = {
    "effect_checkpoint": (checkpoint, attempts_unchanged, True),
    "effect_checkpoint_many": (checkpoint_batch, attempts_unchanged, True),
    "work_fences_live": (receipt_fence, nothing, True),
    "effect_dispose": (dispose, not_disposed, False),
    "work_finalize_if_owner": (finalize, still_processing, True),
    "work_renew_if_owner": (renew, still_processing, True),
    "work_fenced": (fenced_body, summary_unwritten, True),
    "quota_reserve": (quota_reserve, no_reservation, True),
    "quota_release": (quota_release, reservation_untouched, False),
    "quota_hand_out": (quota_hand_out, reservation_untouched, False),
}


async def test_every_fenced_write_judges_the_lease_when_its_transaction_runs(
        store: WorkStore) -> None:
    """The caller read its clock within its lease, then waited past it before the write's
    transaction began: each fenced write is refused as a lost claim and writes nothing.
    (One database for all of them: each write has its own claimed command.)"""
    passed: list[str] = []
    wrote: list[str] = []
    for n, (name, (write, unchanged, wrap)) in enumerate(WRITES.items(), start=1):
        c = await _claimed(store, n)
        if wrap:
            with waits_before_its_transaction(c):
                refused = await write(c)
        else:
            refused = await write(c)
        if not refused:
            passed.append(name)
        if not await unchanged(c):
            wrote.append(name)
    assert passed == [], f"passed the fence of a lease that ended before they ran: {passed}"
    assert wrote == [], f"wrote for a lease that ended before they ran: {wrote}"


async def test_a_renewal_runs_its_ttl_from_when_its_transaction_runs(
        store: WorkStore) -> None:
    """A renewal that waited (within the lease) extends the lease for its TTL from the time
    its UPDATE runs, and says so: the caller's deadline is never later than the row's."""
    c = await _claimed(store)
    inner = store.db.transact

    async def transact_after_a_wait(body: Any, *, name: str, write: bool = True) -> Any:
        c.clock[0] = T0 + 8 * SEC  # the wait: still within the lease
        return await inner(body, name=name, write=write)

    c.clock[0] = T0 + 2 * SEC
    store.db.transact = transact_after_a_wait  # type: ignore[method-assign]
    try:
        got = await store.work_renew_if_owner([c.fence], LEASE, c.now)
    finally:
        store.db.transact = inner  # type: ignore[method-assign]
    assert got.renewed == {c.item.work_id: T0 + 18 * SEC}
    row = await store.work_get(c.item.work_id)
    assert row is not None and row.lease_until_us == T0 + 18 * SEC


async def test_a_retention_batch_judges_its_lease_when_its_transaction_runs(
        store: WorkStore) -> None:
    """The retention pruner's batch is fenced by its own lease (not a WorkItem's): a
    pruner that read its clock within that lease and waited past it before the batch's
    transaction began deletes nothing (another pruner may hold the lease by then)."""
    await enqueue(store, 3, now=T0)
    for item in (await claim(store, now=T0)).claimed:
        assert (await finalize_item(store, item, Succeeded(), now=T0)).applied
    lease = LeaseParams(holder="a", token="ta", ttl_us=60 * SEC, sweep_interval_us=DAY_US)
    assert isinstance(await store.retention_lease_acquire(lease, PAST_WORK), LeaseGranted)
    (rule,) = [r for r in RULES if r.name == "work_items"]
    batch = BatchParams(rule=rule, partition="succeeded", cursor=None, token="ta",
                        cutoffs=Cutoffs(work_us=PAST_WORK - 30 * DAY_US,
                                        facts_us=PAST_WORK - 400 * DAY_US),
                        batch_rows=10, batch_bytes=8_000_000, ttl_us=60 * SEC)
    clock = [PAST_WORK + SEC]  # what the pruner's clock read before the wait
    inner = store.db.transact

    async def transact_after_a_wait(body: Any, *, name: str, write: bool = True) -> Any:
        clock[0] = PAST_WORK + 61 * SEC  # the wait: past the 60 s retention lease
        return await inner(body, name=name, write=write)

    store.db.transact = transact_after_a_wait  # type: ignore[method-assign]
    try:
        with pytest.raises(RetentionLeaseLost):
            await store.retention_prune_batch(batch, lambda: clock[0])
    finally:
        store.db.transact = inner  # type: ignore[method-assign]
    assert await count(store, "work_items") == 3
