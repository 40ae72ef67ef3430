"""The quota ledger: one shared budget row per quota key, and slot reservations.

Theory of operation
-------------------
The schedule itself is pure (:mod:`daemon.core.quota`); this module keeps its state in
the database so that every replica draws from one budget:

* ``quota_grant``: one conditional UPDATE judged by matched rows moves the key's row by
  the schedule's own arithmetic; the row lock it takes serializes grants of one key on
  every backend, so a slot is never handed out twice, and a grant may cover a small
  block of slots, so a hot key costs one row update per block. It binds no claim: the
  racer's and the bench's arithmetic.
* ``quota_reserve``: a claim's slot, fenced (seed 5.1): in one transaction the claim's
  live WorkItem fence, the same grant, and the reservation binding the slot to the claim.
  A stale claimant moves nothing; no slot is ever granted without a reservation naming
  its claim. ``quota_release`` gives a live claim's unused slots back, fenced.
* ``quota_return_lost``: the quota sweep; a lost claim's ``reserved`` slot, once its
  in-flight window has passed, is refunded or spent (:mod:`daemon.core.lost_slots`).
* ``quota_throttle``: a provider 429 blocks the key for every replica in one statement.
* ``quota_return``: unused slots come back when nothing was granted after them.
* ``quota_correct``: a provider's remaining count moves the budget forward (never back)
  for every replica in one statement.
* Fixed windows (:class:`daemon.core.quota.WindowKind`) read the row, decide with the pure
  core and write it back by a compare-and-swap on what was read (a counter per window has
  no single-statement form on both dialects); sliding windows keep the one UPDATE.
* Sliding windows with a burst keep a *slot log* in the row (``slot_log``, see
  :func:`daemon.core.quota.encode_log`): the grant takes the key's row lock with a first
  UPDATE, reads the row, decides with the pure core and writes tat and log in one
  conditional UPDATE on what it read (``tat``, ``blocked_until``, and the two monotone
  counters ``granted_total`` and ``returned_total``, so no ABA), judged by matched rows.
  Under the row lock (InnoDB, SQLite's ``BEGIN IMMEDIATE``) the condition always holds;
  across Galera nodes, where the lock is per node, it is what refuses the loser (it goes
  again). Every other grant path writes ``slot_log = NULL``: a key that later keeps a log
  guesses its history as late as it could have been (never early).
* reservations: a slot bound to one claim (work id + ownership epoch) and, once the
  request is prepared, to its effect attempt; ``reserved -> sent | released |
  spent_unknown``, each a conditional UPDATE on the current state.

Policies (limit, window, jitter) come from the caller's L1/L2 definition; the row records
the latest one for operators only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import attrs

from daemon.core.lost_slots import LostSlot, LostSlotFacts, SendGate, decide_lost_slot
from daemon.core.quota import (
    Granted,
    QuotaPolicy,
    QuotaState,
    ReservationState,
    Wait,
    WindowKind,
    corrected,
    decode_log,
    encode_log,
    grant,
    reservation_transition,
    returned,
    throttled,
)
from daemon.core.quota_waits import JournalEntry
from daemon.core.work import Fence
from storage.bounded import BoundedCount, bounded_count
from storage.history_quota import count_released, count_slot
from storage.idgen import new_ulid
from storage.port import (
    CommitOutcomeUnknown,
    Database,
    DuplicateKey,
    Row,
    SqlTx,
    StorageError,
    WorkConflict,
)
from storage.work_claims import fence_lock
from storage.work_rows import placeholders

_T = TypeVar("_T")
_GATES = frozenset(g.value for g in SendGate)

# Bounded retries of a grant (first grants racing to create the row, unknown COMMITs).
_MAX_CAS_TRIES = 200
# A key's waiting count stops here ("more than" on the page; the gauge saturates): a
# backlog of that size on one key is read as a whole, not item by item.
WAITING_CAP = 10_000

# base = max(tat, blocked, now); the row moves to base + count * interval, only while the
# first slot, max(now, blocked, tat - tolerance), is at or before now + max_wait.
_GRANT_SQL = (
    "UPDATE quota_keys SET tat_us = (CASE WHEN tat_us >= blocked_until_us"
    " THEN (CASE WHEN tat_us > ? THEN tat_us ELSE ? END)"
    " ELSE (CASE WHEN blocked_until_us > ? THEN blocked_until_us ELSE ? END) END) + ?,"
    " granted_total = granted_total + ?, limit_count = ?, window_us = ?, interval_us = ?,"
    " updated_at_us = ?, slot_log = NULL"
    " WHERE quota_key = ? AND tat_us - ? <= ? AND blocked_until_us <= ?"
)
_KEY_COLUMNS = (
    "quota_key, tat_us, blocked_until_us, last_throttled_at_us, throttles_total,"
    " granted_total, returned_total, limit_count, window_us, interval_us, updated_at_us,"
    " slot_log"
)
_NEW_KEY_VALUES = "?, 0, 0, 0, 0, 0, 0, ?, ?, ?, ?, NULL"


class QuotaContention(StorageError):
    """A grant kept losing its compare-and-swap (far beyond ordinary contention)."""


@attrs.frozen
class QuotaKeyView:
    """One key's budget, for operators."""

    quota_key: str
    state: QuotaState
    last_throttled_at_us: int
    throttles_total: int
    granted_total: int
    returned_total: int
    limit_count: int
    window_us: int
    interval_us: int
    updated_at_us: int


@attrs.frozen
class QuotaWaiter:
    """One work item held on quota (pending, ``quota_wait``) and its journal."""

    work_id: str
    family: str
    summary: str
    run_after_us: int
    journal: tuple[JournalEntry, ...]


@attrs.frozen
class QuotaReservation:
    reservation_id: str
    quota_key: str
    slot_at_us: int
    expires_at_us: int
    work_id: str
    ownership_epoch: int
    attempt_id: str | None
    state: ReservationState


def _log(text: object) -> tuple[int, ...]:
    """The stored slot log; one that cannot be read is taken as none (the core then
    guesses the history as late as it could have been: slower, never early)."""
    try:
        return decode_log(None if text is None else str(text))
    except ValueError:
        return ()


def _key_from_row(row: Row) -> QuotaKeyView:
    return QuotaKeyView(
        quota_key=str(row[0]), state=QuotaState(int(row[1]), int(row[2]), _log(row[11])),
        last_throttled_at_us=int(row[3]), throttles_total=int(row[4]),
        granted_total=int(row[5]), returned_total=int(row[6]), limit_count=int(row[7]),
        window_us=int(row[8]), interval_us=int(row[9]), updated_at_us=int(row[10]),
    )


@attrs.frozen
class _Seen:
    """A key's row as read: its state and the two monotone counters (for the CAS)."""

    state: QuotaState
    granted_total: int = 0
    returned_total: int = 0


async def _read_or_create(tx: SqlTx, key: str, policy: QuotaPolicy, now_us: int) -> _Seen:
    rows = await tx.fetchall(
        "SELECT tat_us, blocked_until_us, slot_log, granted_total, returned_total"
        " FROM quota_keys WHERE quota_key = ?", (key,))
    if rows:
        r = rows[0]
        log = _log(r[2]) if policy.uses_slot_log else ()
        return _Seen(QuotaState(int(r[0]), int(r[1]), log), int(r[3]), int(r[4]))
    await tx.execute(
        f"INSERT INTO quota_keys ({_KEY_COLUMNS}) VALUES ({_NEW_KEY_VALUES})",
        (key, policy.limit, policy.window_us, policy.interval_us, now_us))
    return _Seen(QuotaState())


async def _cas(tx: SqlTx, key: str, seen: _Seen, new: QuotaState, policy: QuotaPolicy,
               now_us: int, *, granted: int = 0, returned_count: int = 0) -> bool:
    """Write ``new`` (its slot log, or NULL when the policy keeps none) while the row is
    still what was read."""
    log = encode_log(new.log) if policy.uses_slot_log else None
    matched = await tx.execute(
        "UPDATE quota_keys SET tat_us = ?, blocked_until_us = ?, slot_log = ?,"
        " granted_total = granted_total + ?, returned_total = returned_total + ?,"
        " limit_count = ?, window_us = ?, interval_us = ?, updated_at_us = ?"
        " WHERE quota_key = ? AND tat_us = ? AND blocked_until_us = ?"
        " AND granted_total = ? AND returned_total = ?",
        (new.tat_us, new.blocked_until_us, log, granted, returned_count, policy.limit,
         policy.window_us, policy.interval_us, now_us, key, seen.state.tat_us,
         seen.state.blocked_until_us, seen.granted_total, seen.returned_total))
    return matched == 1


async def _grant_in(tx: SqlTx, key: str, policy: QuotaPolicy, *, now_us: int, count: int,
                    max_wait_us: int) -> Granted | Wait | None:
    """One try of a grant inside ``tx``: granted, a wait, or None (go again: the row was
    just created, or another replica moved it first)."""
    if policy.kind is WindowKind.FIXED or policy.uses_slot_log:
        return await _grant_decided(tx, key, policy, now_us=now_us, count=count,
                                    max_wait_us=max_wait_us)
    step = policy.interval_us
    tau = policy.tolerance_us
    horizon = now_us + max_wait_us
    matched = await tx.execute(_GRANT_SQL, (
        now_us, now_us, now_us, now_us, count * step, count, policy.limit,
        policy.window_us, step, now_us, key, tau, horizon, horizon))
    if matched == 1:
        rows = await tx.fetchall(
            "SELECT tat_us, blocked_until_us FROM quota_keys WHERE quota_key = ?", (key,))
        state = QuotaState(int(rows[0][0]), int(rows[0][1]))
        base = state.tat_us - count * step
        positions = tuple(base + i * step for i in range(count))
        floor = max(now_us, state.blocked_until_us)
        slots = tuple(max(floor, p - tau) for p in positions)
        return Granted(slots, state, () if tau == 0 else positions)
    seen = await _read_or_create(tx, key, policy, now_us)
    decision = grant(policy, seen.state, now_us=now_us, count=count, max_wait_us=max_wait_us)
    return decision if isinstance(decision, Wait) else None  # created: go again


async def _grant_decided(tx: SqlTx, key: str, policy: QuotaPolicy, *, now_us: int,
                         count: int, max_wait_us: int) -> Granted | Wait | None:
    if policy.uses_slot_log:
        # Take the row lock first, so that grants of one key queue on it rather than
        # lose the compare-and-swap below.
        await tx.execute("UPDATE quota_keys SET updated_at_us = ? WHERE quota_key = ?",
                         (now_us, key))
    seen = await _read_or_create(tx, key, policy, now_us)
    decision = grant(policy, seen.state, now_us=now_us, count=count, max_wait_us=max_wait_us)
    if isinstance(decision, Wait):
        return decision
    if await _cas(tx, key, seen, decision.state, policy, now_us, granted=count):
        return decision
    return None  # another replica moved it first: decide again


async def _return_in(tx: SqlTx, key: str, policy: QuotaPolicy, unused: tuple[int, ...],
                     now_us: int) -> bool:
    """Give back ``unused`` positions of ``key`` inside ``tx`` (False: they cannot come
    back, and simply expire unused)."""
    rows = await tx.fetchall(
        "SELECT tat_us, blocked_until_us, slot_log, granted_total, returned_total"
        " FROM quota_keys WHERE quota_key = ?", (key,))
    if not rows:
        return False
    r = rows[0]
    seen = _Seen(QuotaState(int(r[0]), int(r[1]), _log(r[2]) if policy.uses_slot_log else ()),
                 int(r[3]), int(r[4]))
    new = returned(policy, seen.state, unused)
    if new is None:
        return False
    return await _cas(tx, key, seen, new, policy, now_us, returned_count=len(unused))


@attrs.frozen
class SlotReserved:
    """One granted slot, bound to the claim that asked, in the transaction that granted
    it (:meth:`QuotaLedger.quota_reserve`)."""

    reservation_id: str
    slot_us: int
    position_us: int
    expires_at_us: int


@attrs.frozen
class SlotRelease:
    """A reserved slot to give back: its reservation, key, policy and position."""

    reservation_id: str
    key: str
    policy: QuotaPolicy
    position_us: int


@attrs.frozen
class LostSlotSettled:
    """What the quota sweep did with one lost claim's reservation."""

    reservation_id: str
    quota_key: str
    work_id: str
    ownership_epoch: int
    decision: LostSlot
    returned: bool  # given back on the key's line (a refund whose slot was the newest)


class QuotaLedger:
    db: Database

    async def _granting(self, key: str, body: Callable[[SqlTx], Awaitable[_T | None]],
                        *, name: str) -> _T:
        for _ in range(_MAX_CAS_TRIES):
            try:
                result = await self.db.transact(body, name=name)
            except DuplicateKey:
                continue  # two first grants created the row at once; the other won
            except CommitOutcomeUnknown:
                # If it did commit, those slots are simply never used: capacity lost,
                # never exceeded (a reservation it bound to a claim is settled by the
                # quota sweep once that claim ends). Ask again.
                continue
            if result is not None:
                return result
        raise QuotaContention(f"quota key {key}: could not grant")

    async def quota_grant(self, key: str, policy: QuotaPolicy, *, now_us: int, count: int = 1,
                          max_wait_us: int = 0) -> Granted | Wait:
        """Up to ``count`` slots of ``key``'s shared budget, or when to come back: the
        ledger's arithmetic alone, bound to no claim (the quota racer and bench; a
        claim's send slot is :meth:`quota_reserve`, fenced).

        One conditional UPDATE, judged by matched rows, moves the budget by exactly the
        arithmetic of :func:`daemon.core.quota.grant` (``start = max(tat, blocked, now)``,
        allowed while ``start <= now + max_wait``); the read after it, under the row lock
        the UPDATE took, tells which slots it moved over. Concurrent grants queue on the
        row instead of failing a compare-and-swap and starting again.
        """
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")

        async def body(tx: SqlTx) -> Granted | Wait | None:
            return await _grant_in(tx, key, policy, now_us=now_us, count=count,
                                   max_wait_us=max_wait_us)

        return await self._granting(key, body, name="quota.grant")

    async def quota_reserve(self, key: str, policy: QuotaPolicy, *, fence: Fence,
                            gate: SendGate, now: Callable[[], int], max_wait_us: int = 0,
                            from_us: int | None = None) -> SlotReserved | Wait:
        """One slot of ``key`` for the claim ``fence``, or when to come back: in one
        transaction, the live WorkItem fence (``LostLease``, rolled back: a stale
        claimant moves no shared budget, seed 5.1), the grant
        (:meth:`quota_grant`'s statement) and the reservation binding the slot to the
        claim, with its position and its :class:`~daemon.core.lost_slots.SendGate`. A
        slot is thus never granted without a reservation naming its claim: a claim lost
        later leaves it ``reserved``, for the quota sweep (:meth:`quota_return_lost`).
        ``now`` is the clock, read inside the transaction: the fence is judged, and the
        reservation recorded, at the time its statements run (a time read before a
        wait for a connection, or a freeze, would let a claimant whose lease ended
        meanwhile take a slot). ``from_us`` is the time the slot is asked from (a later
        key of several is asked from the latest slot so far, a claim asks a lead ahead);
        never earlier than that reading."""

        async def body(tx: SqlTx) -> SlotReserved | Wait | None:
            at = now()
            await fence_lock(tx, fence, at)  # first: it takes the item's row lock
            asked = at if from_us is None else max(from_us, at)
            got = await _grant_in(tx, key, policy, now_us=asked, count=1,
                                  max_wait_us=max_wait_us)
            if not isinstance(got, Granted):
                return got
            slot, place = got.slots[0], got.places[0]
            expires = slot + policy.jitter_us
            rid = await reservation_open(tx, quota_key=key, slot_at_us=slot,
                                         expires_at_us=expires, work_id=fence.work_id,
                                         ownership_epoch=fence.ownership_epoch,
                                         now_us=at, position_us=place, gate=gate,
                                         limit=(policy.limit, policy.window_us))
            return SlotReserved(rid, slot, place, expires)

        return await self._granting(key, body, name="quota.reserve")

    async def quota_release(self, fence: Fence, slots: Sequence[SlotRelease], *,
                            now: Callable[[], int]) -> None:
        """Give back slots the live claim ``fence`` reserved and will not use (nothing
        was sent on them): each reservation ``reserved -> released`` and its position
        returned, in one fenced transaction. ``LostLease``: nothing written; the quota
        sweep returns them once their window has passed. ``now`` is read inside the
        transaction."""

        async def body(tx: SqlTx) -> None:
            now_us = now()
            await fence_lock(tx, fence, now_us)
            for s in sorted(slots, key=lambda s: (s.key, s.position_us)):
                await reservation_move(tx, s.reservation_id, ReservationState.RELEASED,
                                       now_us=now_us)
                await _return_in(tx, s.key, s.policy, (s.position_us,), now_us)

        await self.db.transact(body, name="quota.release")

    async def quota_hand_out(self, fence: Fence, reservation_ids: Sequence[str], *,
                             now: Callable[[], int]) -> None:
        """A read's slots leave :func:`~daemon.services.effect_quota.reserve` (its request
        may leave from here on, with no checkpoint to say so): ``granted -> handed``,
        fenced. ``LostLease``: nothing handed out, nothing sent. ``now`` is read inside
        the transaction."""

        async def body(tx: SqlTx) -> None:
            now_us = now()
            await fence_lock(tx, fence, now_us)
            await tx.execute(
                f"UPDATE quota_reservations SET send_gate = ?, updated_at_us = ?"
                f" WHERE reservation_id IN ({placeholders(len(reservation_ids))})"
                " AND state = ? AND send_gate = ?",
                (SendGate.HANDED.value, now_us, *reservation_ids,
                 ReservationState.RESERVED.value, SendGate.GRANTED.value))

        await self.db.transact(body, name="quota.hand_out")

    async def quota_return_lost(self, policies: Mapping[str, QuotaPolicy], *, now_us: int,
                                margin_us: int, limit: int = 100) -> list[LostSlotSettled]:
        """The quota sweep: reservations still ``reserved`` whose in-flight window
        (``expires_at`` plus ``margin``, the replicas' clock spread) has passed and whose
        claim is lost are refunded (``released``, given back by position when nothing was
        granted after them) or spent (``spent_unknown``) as
        :func:`daemon.core.lost_slots.decide_lost_slot` says; each by one compare-and-swap
        out of ``reserved``, in its own transaction with its give-back, so no slot comes
        back twice. A key ``policies`` does not name is settled without a give-back."""

        async def candidates(tx: SqlTx) -> list[Row]:
            return await tx.fetchall(
                "SELECT r.reservation_id, r.quota_key, r.work_id, r.ownership_epoch,"
                " r.position_us, r.send_gate, w.state, w.ownership_epoch, a.attempt_id,"
                " r.slot_at_us FROM quota_reservations r"
                " LEFT JOIN work_items w ON w.work_id = r.work_id"
                " LEFT JOIN effect_attempts a ON a.work_id = r.work_id"
                " AND a.ownership_epoch = r.ownership_epoch"
                " WHERE r.state = ? AND r.expires_at_us <= ?"
                # Live claims settle their own slots: leave them out here, so that many
                # slow live sends never crowd a lost claim's slot out of the batch.
                " AND (w.work_id IS NULL OR w.state <> 'processing'"
                " OR w.ownership_epoch <> r.ownership_epoch)"
                " ORDER BY r.expires_at_us LIMIT ?",
                (ReservationState.RESERVED.value, now_us - margin_us, limit))

        out = []
        for row in await self.db.transact(candidates, name="quota.lost_candidates",
                                          write=False):
            facts = LostSlotFacts(
                claim_live=row[6] == "processing" and row[7] is not None
                and int(row[7]) == int(row[3]),
                window_passed=True,  # selected so
                gate=SendGate(row[5]) if row[5] in _GATES else None,
                checkpointed=row[8] is not None)
            decision = decide_lost_slot(facts)
            if decision is LostSlot.KEEP:
                continue
            settled = await self._settle_lost(row, decision, policies, now_us)
            if settled is not None:
                out.append(settled)
        return out

    async def _settle_lost(self, row: Row, decision: LostSlot,
                           policies: Mapping[str, QuotaPolicy], now_us: int
                           ) -> LostSlotSettled | None:
        rid, key = str(row[0]), str(row[1])
        target = (ReservationState.RELEASED if decision is LostSlot.REFUND
                  else ReservationState.SPENT_UNKNOWN)
        policy = policies.get(key)

        async def body(tx: SqlTx) -> LostSlotSettled | None:
            moved = await tx.execute(
                "UPDATE quota_reservations SET state = ?, updated_at_us = ?"
                " WHERE reservation_id = ? AND state = ?",
                (target.value, now_us, rid, ReservationState.RESERVED.value))
            if moved != 1:
                return None  # another replica's sweep (or the claim itself) settled it
            if target is ReservationState.RELEASED:  # the console's quota history
                await count_released(tx, key, int(row[9]))
            gave_back = (decision is LostSlot.REFUND and policy is not None
                         and row[4] is not None
                         and await _return_in(tx, key, policy, (int(row[4]),), now_us))
            return LostSlotSettled(rid, key, str(row[2]), int(row[3]), decision, gave_back)

        return await self.db.transact(body, name="quota.return_lost")

    async def quota_correct(self, key: str, policy: QuotaPolicy, *, now_us: int,
                            remaining: int) -> bool:
        """The provider says ``remaining`` requests are left: when that is fewer than the
        row would grant, move its TAT forward for every replica in one statement (a
        conditional UPDATE that only ever raises it). True when it moved."""
        target = corrected(policy, QuotaState(), now_us=now_us, remaining=remaining)
        if target is None:
            return False

        async def body(tx: SqlTx) -> bool:
            matched = await tx.execute(
                "UPDATE quota_keys SET tat_us = ?, updated_at_us = ?"
                " WHERE quota_key = ? AND tat_us < ?",
                (target.tat_us, now_us, key, target.tat_us))
            return matched == 1

        return await self.db.transact(body, name="quota.correct")

    async def quota_throttle(self, key: str, policy: QuotaPolicy, *, now_us: int,
                             retry_after_us: int, is_429: bool = True) -> QuotaState:
        """A provider 429: block ``key`` until ``now + retry_after`` for every replica.
        ``is_429=False``: the same block from an answer that said none remain (until its
        reset), not counted as a throttle."""

        async def body(tx: SqlTx) -> QuotaState:
            seen = (await _read_or_create(tx, key, policy, now_us)).state
            new = throttled(seen, now_us=now_us, retry_after_us=retry_after_us)
            # One statement moves the shared budget; it never moves a block back.
            counted = (" last_throttled_at_us = ?, throttles_total = throttles_total + 1,"
                       if is_429 else "")
            await tx.execute(
                "UPDATE quota_keys SET blocked_until_us = CASE WHEN blocked_until_us < ?"
                f" THEN ? ELSE blocked_until_us END,{counted} updated_at_us = ?"
                " WHERE quota_key = ?",
                (new.blocked_until_us, new.blocked_until_us,
                 *((now_us,) if is_429 else ()), now_us, key))
            return new

        for _ in range(_MAX_CAS_TRIES):
            try:
                return await self.db.transact(body, name="quota.throttle")
            except DuplicateKey:
                continue
        raise QuotaContention(f"quota key {key}: could not record a throttle")

    async def quota_return(self, key: str, policy: QuotaPolicy, unused: tuple[int, ...], *,
                           now_us: int) -> bool:
        """Give back unused slots by their positions (``Granted.places``); False when they
        cannot come back (they expire unused)."""

        async def body(tx: SqlTx) -> bool:
            return await _return_in(tx, key, policy, unused, now_us)

        return await self.db.transact(body, name="quota.return")

    async def quota_keys(self, prefix: str = "", limit: int = 200) -> list[QuotaKeyView]:
        async def body(tx: SqlTx) -> list[QuotaKeyView]:
            rows = await tx.fetchall(
                f"SELECT {_KEY_COLUMNS} FROM quota_keys WHERE quota_key >= ?"
                " ORDER BY quota_key LIMIT ?", (prefix, limit))
            return [_key_from_row(r) for r in rows if str(r[0]).startswith(prefix)]

        return await self.db.transact(body, name="quota.keys", write=False)

    async def quota_reservations_in_flight(self) -> dict[str, int]:
        """Quota key -> reservations still ``reserved`` (bound to a claim, not yet sent)."""

        async def body(tx: SqlTx) -> dict[str, int]:
            rows = await tx.fetchall(
                "SELECT quota_key, COUNT(*) FROM quota_reservations WHERE state = ?"
                " GROUP BY quota_key", (ReservationState.RESERVED.value,))
            return {str(r[0]): int(r[1]) for r in rows}

        return await self.db.transact(body, name="quota.in_flight", write=False)

    async def quota_waiting_counts(self, keys: Sequence[str], cap: int | None = None
                                   ) -> dict[str, BoundedCount]:
        """Work rescheduled for quota (``quota_wait``, pending) per quota key, each
        counted up to ``cap`` (default :data:`WAITING_CAP`; "more" past it).

        One range of the ``quota_wait_key`` index per key (migration 0045: the key the
        held item's summary names, computed from its row), so a key costs at most
        ``cap`` index entries: reading every held item's summary took 1.6 s at 50,000
        held items (issue 23)."""

        bound = WAITING_CAP if cap is None else cap

        async def body(tx: SqlTx) -> dict[str, BoundedCount]:
            return {key: await bounded_count(
                tx, "SELECT 1 FROM work_items WHERE quota_wait_key = ?", (key,), bound)
                for key in keys}

        return await self.db.transact(body, name="quota.waiting", write=False)

    async def quota_waiters(self, limit: int, keys: Sequence[str] | None = None
                            ) -> list[QuotaWaiter]:
        """Up to ``limit`` items held on quota (the oldest items first), each with its
        execution journal (the console's "what is waiting on each key"); with ``keys``,
        up to ``limit`` of each of those keys.

        Oldest by work id, an index order ((state, failure_class, work_id), migration
        0022): ordering by ``run_after_us`` sorted every held item to show ``limit`` of
        them (50,000 of them at 1M open items; issue 23). Per key, a range of the
        ``quota_wait_key`` index (migration 0045; its entries end with the work id):
        read across keys, one busy key's oldest items hid every other key's."""

        async def body(tx: SqlTx) -> list[QuotaWaiter]:
            columns = "SELECT work_id, family, operator_summary, run_after_us FROM work_items"
            if keys is None:
                rows = await tx.fetchall(
                    f"{columns} WHERE state = 'pending' AND failure_class = 'quota_wait'"
                    " ORDER BY work_id LIMIT ?", (limit,))
            else:
                rows = [row for key in keys for row in await tx.fetchall(
                    f"{columns} WHERE quota_wait_key = ? ORDER BY work_id LIMIT ?",
                    (key, limit))]
            if not rows:
                return []
            ids = [str(r[0]) for r in rows]
            journal: dict[str, list[JournalEntry]] = {i: [] for i in ids}
            for w, epoch, outcome, reason, at in await tx.fetchall(
                    "SELECT work_id, ownership_epoch, outcome, reason, finished_at_us"
                    f" FROM work_executions WHERE work_id IN ({placeholders(len(ids))})",
                    tuple(ids)):
                journal[str(w)].append(JournalEntry(int(epoch), str(outcome),
                                                    None if reason is None else str(reason),
                                                    int(at)))
            return [QuotaWaiter(str(w), str(f), str(summary or ""), int(after),
                                tuple(journal[str(w)])) for w, f, summary, after in rows]

        return await self.db.transact(body, name="quota.waiters", write=False)

    async def quota_reservations(self, work_id: str) -> list[QuotaReservation]:
        async def body(tx: SqlTx) -> list[QuotaReservation]:
            rows = await tx.fetchall(
                f"SELECT {_RESERVATION_COLUMNS} FROM quota_reservations WHERE work_id = ?"
                " ORDER BY reservation_id", (work_id,))
            return [_reservation_from_row(r) for r in rows]

        return await self.db.transact(body, name="quota.reservations", write=False)


_RESERVATION_COLUMNS = (
    "reservation_id, quota_key, slot_at_us, expires_at_us, work_id, ownership_epoch,"
    " attempt_id, state"
)


def _reservation_from_row(row: Row) -> QuotaReservation:
    return QuotaReservation(
        reservation_id=str(row[0]), quota_key=str(row[1]), slot_at_us=int(row[2]),
        expires_at_us=int(row[3]), work_id=str(row[4]), ownership_epoch=int(row[5]),
        attempt_id=None if row[6] is None else str(row[6]), state=ReservationState(row[7]),
    )


async def reservation_open(tx: SqlTx, *, quota_key: str, slot_at_us: int, expires_at_us: int,
                           work_id: str, ownership_epoch: int, now_us: int,
                           position_us: int | None = None,
                           gate: SendGate | None = None,
                           limit: tuple[int, int] | None = None) -> str:
    """Bind one granted slot to one claim, inside that claim's fenced transaction."""
    reservation_id = new_ulid(now_us)
    await tx.execute(
        f"INSERT INTO quota_reservations ({_RESERVATION_COLUMNS}, created_at_us,"
        " updated_at_us, position_us, send_gate)"
        " VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?)",
        (reservation_id, quota_key, slot_at_us, expires_at_us, work_id, ownership_epoch,
         ReservationState.RESERVED.value, now_us, now_us, position_us,
         None if gate is None else gate.value))
    await count_slot(tx, quota_key, slot_at_us, limit)  # the console's quota history
    return reservation_id


async def reservation_move(tx: SqlTx, reservation_id: str, target: ReservationState, *,
                           now_us: int, attempt_id: str | None = None) -> None:
    """``reserved -> target`` (idempotent when already there); anything else is refused."""
    rows = await tx.fetchall(
        "SELECT state, attempt_id, quota_key, slot_at_us FROM quota_reservations"
        " WHERE reservation_id = ?", (reservation_id,))
    if not rows:
        raise WorkConflict(f"no quota reservation {reservation_id}")
    current = ReservationState(rows[0][0])
    if not reservation_transition(current, target):
        raise WorkConflict(f"quota reservation {reservation_id} is {current.value},"
                           f" cannot become {target.value}")
    if current == target:
        return
    matched = await tx.execute(
        "UPDATE quota_reservations SET state = ?, attempt_id = COALESCE(?, attempt_id),"
        " updated_at_us = ? WHERE reservation_id = ? AND state = ?",
        (target.value, attempt_id, now_us, reservation_id, current.value))
    if matched != 1:
        raise WorkConflict(f"quota reservation {reservation_id} changed concurrently")
    if target is ReservationState.RELEASED:  # the console's quota history
        await count_released(tx, str(rows[0][2]), int(rows[0][3]))
