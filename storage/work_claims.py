"""Claim, renew, finalize and the fence: the compare-and-swap half of the kernel.

Theory of operation
-------------------
*Claim* is two steps: select eligible candidate ids (oldest first, lane rules
applied by the database), then one conditional UPDATE over the chosen ids that
re-checks ``state`` and ``run_after`` and installs a fresh lease token,
``ownership_epoch + 1`` and ``attempt + 1``. An idle claimer selects with a
plain read first (no write transaction when there is nothing to do); a busy
one selects inside the short write transaction, leaving other replicas less
time to race for the same rows.
Replicas claiming at one moment would all read the same oldest rows and race
for them; a claim names a *spread* (``daemon/core/claim_spread.py``, widened by
the scheduler after a lost race) and reads its window from a batch-sized slot that
deep into the ready set (``OFFSET``): a random one, or one of its rank's among the
live claimants (``claim_slot``). When the ready set is shallower than the slot, it
halves the slot (down to the oldest window) or, knowing its rank, shares the
batches there are by rank (``shallow_slot``). A busy claimant that knows its rank
reads its own part of the ready set instead (``claim_part``: work ids ending in its
rank's characters; parts do not move as other claimants take rows ahead), and tops a
short part up only from the next rank's part beyond its oldest batch; it then claims
short rather than race the owners of the rest. That only makes races rare:
exclusivity is still the UPDATE's CAS, and the lane rules are still the database's.
Whatever rows that UPDATE matched are ours; we read them back by token. Two
claimants racing for a row cannot both match it: the second UPDATE sees the
first's committed ``processing`` state (row locks on MySQL-family servers;
the single writer lock on SQLite).

Target lanes: the claim UPDATE copies ``target_lane`` into the unique
``target_lane_hold`` column, so a second holder of one lane is a duplicate-key
error, not a silent overlap. When a batch UPDATE meets that error we retry
the batch row by row, so only the conflicting row is skipped.

Source lanes: a candidate is eligible only when no earlier item of its lane
is non-terminal. Sequence numbers are handed out under the lane counter's row
lock at enqueue and terminal states never reopen, so "head of lane" cannot
become false between the select and the UPDATE.

Capability: a claimant states the newest engine capability and payload schema
it can run; candidates and expired leases of work written for newer ones are
not selected, so that work waits for a replica that can run it.

Every execution is journaled (``storage/work_executions.py``): a reclaim
writes the superseded epoch as ``lease_lost`` in the reclaim's transaction. A
claim whose COMMIT outcome is unknown is reconciled by reading the rows that
carry our token (retried while the database is still away), then run.

Admission: a family under the ownership-cutover protocol (seed 11,
``storage/cutover/``) is claimable only while its owner-generation row names
integrationd. The claim and reclaim UPDATEs read that row by primary key in
the statement itself (``CLAIM_ADMITTED``), never from a cache, so a replica
that missed a step cannot claim after it. A family with no row never had
another claimant.

Every later write names the fence: ``(work_id, lease_token, ownership_epoch)``
with ``state = 'processing'`` and an unexpired lease. A claimant whose lease
expired, even if nobody reclaimed the row yet, can change nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import trio

from daemon.core.claim_spread import claim_part, claim_slot, shallow_slot
from daemon.core.lanes import Candidate, pick_batch
from daemon.core.outcomes import Finalization
from daemon.core.states import EXECUTABLE, WorkEvent, WorkState
from daemon.core.work import Fence, WorkItem
from storage.coalesce import Coalescing
from storage.idgen import new_lease_token
from storage.port import (
    ClaimParams,
    ClaimResult,
    CommitOutcomeUnknown,
    Database,
    DuplicateKey,
    FinalizeResult,
    LostLease,
    Reclaim,
    RenewGroup,
    RenewResult,
    SqlTx,
    StorageError,
)
from storage.work_executions import DEFERRED, LEASE_LOST, journal_entry
from storage.work_executions import journal as journal_rows
from storage.work_rows import (
    LANE_BLOCKING_SQL,
    SELECT_WORK,
    fence_predicate,
    from_row,
    in_states,
    placeholders,
)

T = TypeVar("T")
SideWrite = Callable[[SqlTx], Awaitable[None]]

# A family whose admission is closed (a cutover or a rollback draining) offers no
# ready candidates: its ready rows are not contention (the scheduler would claim again
# at once, spinning on the database until admission reopens). The claim statement
# still decides (``CLAIM_ADMITTED``); this keeps the scheduler idle meanwhile.
# (Expired rows are still read: a spent one is dead-lettered whatever the admission.)
_CANDIDATE_ADMITTED = (
    " AND NOT EXISTS (SELECT 1 FROM owner_generations g"
    " WHERE g.family = w.family AND g.claimant <> 'integrationd')"
)
_READY_HEAD = (
    "SELECT w.work_id, w.org_id, w.source_lane, w.target_lane, w.run_after_us"
    " FROM work_items w"
    " WHERE w.state = ? AND w.family = ? AND w.run_after_us <= ?"
    " AND w.engine_capability_version <= ? AND w.payload_schema_version <= ?"
    + _CANDIDATE_ADMITTED
)
_READY_TAIL = (
    " AND (w.target_lane IS NULL OR NOT EXISTS ("
    "   SELECT 1 FROM work_items h WHERE h.target_lane_hold = w.target_lane))"
    " AND (w.source_lane IS NULL OR NOT EXISTS ("
    "   SELECT 1 FROM work_items p WHERE p.source_lane = w.source_lane"
    f"   AND p.state IN {LANE_BLOCKING_SQL} AND p.source_seq < w.source_seq))"
    " ORDER BY w.run_after_us, w.work_id LIMIT ?"
)
_READY_SQL = _READY_HEAD + _READY_TAIL + " OFFSET ?"


# A claimant's own part of the ready set: work ids ending in one of its suffixes
# (daemon/core/claim_spread.py ``claim_part``; SUBSTR from the end is SQLite's, MySQL's
# and TiDB's alike).
def _ready_part_sql(width: int, suffixes: int, *, newest: bool = False) -> str:
    tail = (_READY_TAIL.replace("ORDER BY w.run_after_us, w.work_id",
                                "ORDER BY w.run_after_us DESC, w.work_id DESC")
            if newest else _READY_TAIL)
    return (_READY_HEAD + f" AND SUBSTR(w.work_id, -{width}) IN ({placeholders(suffixes)})"
            + tail)


_READY_ORG_SQL = _READY_HEAD + " AND w.org_id = ?" + _READY_TAIL
_READY_STATES = (WorkState.PENDING, WorkState.RETRY)


def _ready_org_sql(op: str) -> str:
    """The first org from (``>=``) or after (``>``) an org id with a ready row, and its
    oldest ready row's ``run_after_us`` (the index orders each org's rows by it): a seek
    on work_items_org_ready."""
    return ("SELECT org_id, run_after_us FROM work_items"
            f" WHERE state = ? AND family = ? AND org_id {op} ? AND run_after_us <= ?"
            " ORDER BY org_id, run_after_us LIMIT 1")


_READY_ORG_FROM_SQL = _ready_org_sql(">=")
_READY_ORG_AFTER_SQL = _ready_org_sql(">")
MAX_FAIR_ORGS = 8
# Backoff of the read-back after a claim COMMIT with an unknown outcome.
RECONCILE_FIRST_PAUSE_S = 0.05
RECONCILE_MAX_PAUSE_S = 1.0

_CLAIM_SET = (
    "UPDATE work_items SET state = 'processing', lease_owner = ?, lease_token = ?,"
    " lease_until_us = ?, ownership_epoch = ownership_epoch + 1, attempt = attempt + 1,"
    " target_lane_hold = target_lane, row_version = row_version + 1, updated_at_us = ?"
)
# Admission, in the claim statement itself (never from a cache): a family under
# the cutover protocol (daemon/core/cutover.py) is claimable only while its
# owner-generation row, read by primary key, names integrationd. No row: the
# family never had another claimant. One argument: the family.
CLAIM_ADMITTED = (
    " AND NOT EXISTS (SELECT 1 FROM owner_generations g"
    " WHERE g.family = ? AND g.claimant <> 'integrationd')"
)
_CLAIM_WHERE = f" AND state IN {in_states(EXECUTABLE)} AND run_after_us <= ?{CLAIM_ADMITTED}"

_EXPIRED_SQL = (
    "SELECT work_id, lease_token, ownership_epoch, attempt, max_attempts, lease_owner"
    " FROM work_items"
    " WHERE state = 'processing' AND lease_until_us < ? AND family = ?"
    " AND engine_capability_version <= ? AND payload_schema_version <= ?"
    " ORDER BY lease_until_us LIMIT ?"
)


async def fence_lock(tx: SqlTx, fence: Fence, now_us: int) -> None:
    """Hold the live fence inside ``tx``, or raise :class:`LostLease`.

    An UPDATE (not a SELECT) so that the row stays locked until COMMIT on
    MySQL-family servers: no reclaim can slip in between this check and the
    caller's other writes in the same transaction.
    """
    matched = await tx.execute(
        "UPDATE work_items SET row_version = row_version + 1"
        " WHERE work_id = ? AND state = 'processing' AND lease_token = ?"
        " AND ownership_epoch = ? AND lease_until_us >= ?",
        (fence.work_id, fence.lease_token, fence.ownership_epoch, now_us),
    )
    if matched != 1:
        raise LostLease(fence)


async def fence_lock_many(tx: SqlTx, fences: Sequence[Fence], now_us: int) -> set[str]:
    """:func:`fence_lock` for many items in two statements at most: the work
    ids whose live fence ``tx`` now holds (the others are left untouched)."""
    if not fences:
        return set()
    matched = await tx.execute(
        "UPDATE work_items SET row_version = row_version + 1"
        " WHERE state = 'processing' AND lease_until_us >= ? AND ("
        + " OR ".join("(work_id = ? AND lease_token = ? AND ownership_epoch = ?)"
                      for _ in fences) + ")",
        (now_us, *(v for f in fences for v in (f.work_id, f.lease_token, f.ownership_epoch))),
    )
    if matched == len(fences):
        return {f.work_id for f in fences}
    # Some fences are gone: the rows we locked still carry ours (nobody else
    # can change them before COMMIT); a row that did not match never will.
    rows = await tx.fetchall(
        f"SELECT work_id, lease_token, ownership_epoch FROM work_items"
        f" WHERE work_id IN ({placeholders(len(fences))}) AND state = 'processing'"
        " AND lease_until_us >= ?",
        (*(f.work_id for f in fences), now_us),
    )
    held = {(str(r[0]), str(r[1]), int(r[2])) for r in rows}
    return {f.work_id for f in fences if (f.work_id, f.lease_token, f.ownership_epoch) in held}


class WorkClaims:
    """Claim-side methods of the work store (mixed into ``WorkStore``)."""

    db: Database

    async def work_claim(self, params: ClaimParams, now_us: int) -> ClaimResult:
        token = new_lease_token()
        lease_until = now_us + params.lease_ttl_us

        async def candidates(tx: SqlTx) -> tuple[list[tuple[Any, ...]], list[Candidate]]:
            expired: list[tuple[Any, ...]] = []
            if params.include_expired:
                expired = await tx.fetchall(_EXPIRED_SQL, (
                    now_us, params.family, *_runnable(params), params.limit))
            room = params.limit - len(expired)
            picked = await self._pick(tx, attrs.evolve(params, limit=room), now_us) if room else []
            return expired, picked

        found: tuple[list[tuple[Any, ...]], list[Candidate]] | None = None
        if params.probe_first:
            # A plain read first: an idle poll then costs no write transaction.
            found = await self.db.transact(candidates, name="work.claim.candidates",
                                           write=False)
            if not found[0] and not found[1]:
                return ClaimResult(claimed=[], expired_dead=[], contended=0)
        touched: list[str] = []
        superseded: list[Reclaim] = []

        async def body(tx: SqlTx) -> ClaimResult:
            touched.clear()
            superseded.clear()
            contended = 0
            expired, picked = found if found is not None else await candidates(tx)
            reclaimed, swept = await self._sweep_expired(
                tx, params, expired, token, lease_until, now_us)
            superseded.extend(swept)
            touched.extend(reclaimed)
            ids = [c.work_id for c in picked]
            if ids:
                touched.extend(ids)
                won = await self._claim_ids(tx, ids, params, token, lease_until, now_us)
                contended += len(ids) - won
            claimed: list[WorkItem] = []
            if touched:
                rows = await tx.fetchall(
                    f"{SELECT_WORK} WHERE work_id IN ({placeholders(len(touched))})"
                    " AND lease_token = ? AND state = 'processing'",
                    (*touched, token),
                )
                claimed = [from_row(r) for r in rows]
            return ClaimResult(claimed=claimed, contended=contended,
                               expired_dead=[c.work_id for c in swept if c.dead],
                               reclaimed=swept)

        try:
            return await self.db.transact(body, name="work.claim")
        except CommitOutcomeUnknown:
            # The claim may have committed: whatever carries our token is ours.
            claimed = await self._reconcile_claim(touched, token, params.lease_ttl_us)
            ours = {i.work_id for i in claimed}
            return ClaimResult(claimed=claimed, expired_dead=[], contended=0,
                               reclaimed=[c for c in superseded if c.work_id in ours])

    async def _pick(self, tx: SqlTx, params: ClaimParams, now_us: int) -> list[Candidate]:
        window = max(params.window, params.limit)
        # The claimant's slot of the ready set (see ClaimParams.spread): its window
        # starts ``slot`` batches deep, so that claimants in different slots read
        # different rows and do not race for them.
        # Slots are ``stride`` rows (the family's batch), whatever this claim's limit:
        # claimants claiming fewer than a batch (a few free slots) still start on the
        # same slot boundaries as the others, so different slots never overlap.
        unit = params.stride or params.limit
        part = claim_part(params.rank, params.claimants) if params.parted else ()
        own: list[tuple[Any, ...]] = []
        if part:
            # Its own part first: the oldest rows whose work ids end in its rank's
            # suffixes. Parts do not move when other claimants take rows ahead (slots,
            # offsets into the ready set, do), so claimants with one view of ``c`` do
            # not race at all while their parts last.
            own = await self._ready_part(tx, params, window, part, now_us)
        if part and len(own) < params.limit:
            # Its part is running dry: the newest rows of the next rank's part (no two
            # claimants steal from one part), leaving that part's oldest batch (a full
            # claim's, ``unit``) to its owner, which claims it oldest first: the two do
            # not meet.
            victim = claim_part((params.rank + 1) % params.claimants, params.claimants)
            newest = await self._ready_part(tx, params, window, victim, now_us, newest=True)
            own = own + newest[:max(0, len(newest) - unit)]
        if part:
            # Its part (and what it could take from the next) is what it claims, even
            # short or nothing: the other rows are other claimants' oldest, and taking
            # them raced their owners (the tail of a drain, traced: most of its lost
            # races). Its scheduler's next claim, after a short one, is not parted.
            slot, rows = 0, own
        else:
            slot = claim_slot(params.spread, params.rotation, rank=params.rank,
                              claimants=params.claimants)
            rows = await self._ready_window(tx, params, window, max(0, slot) * unit, now_us)
        skip = max(0, slot) * unit
        if slot > 0 and len(rows) < params.limit and params.claimants > 1:
            # The ready set is shallower than this slot: the claimants share the batches
            # it has by rank (each state's rows in one read, the shallow ready set whole
            # down to a batch per claimant and a window: deeper, every rank has its
            # batch within that; the slot's window is cut from them).
            depth = min(skip, params.claimants * unit) + window
            arms = await self._ready_arms(tx, params, depth, now_us)
            slot = shallow_slot(params.rotation, rank=params.rank, claimants=params.claimants,
                                batches=min(depth, sum(map(len, arms))) // unit)
            skip = max(0, slot) * unit
            rows = sorted([r for arm in arms for r in arm[skip:skip + window]],
                          key=_ready_order)[:window]
        elif slot > 0 and len(rows) < params.limit:
            # The ready set is shallower than this slot: half as deep (so that claimants
            # whose slots all lie beyond a shrinking ready set still start in different
            # places), down to the oldest window and its strides. Each state's rows down
            # to this slot's window come in one read (the shallow ready set, whole), and
            # each shallower slot's window is cut from them as its own read would be.
            arms = await self._ready_arms(tx, params, slot * unit + window, now_us)
            while slot > 0 and len(rows) < params.limit:
                slot = slot // 2 or -1
                skip = max(0, slot) * unit
                rows = sorted([r for arm in arms for r in arm[skip:skip + window]],
                              key=_ready_order)[:window]
        orgs = [o for o in params.orgs[:MAX_FAIR_ORGS] if o not in {str(r[1]) for r in rows}]
        if orgs:
            share = max(1, params.limit // (len(orgs) + 1))
            rows.extend(await tx.fetchall(*_union_all([
                (_READY_ORG_SQL, (state.value, params.family, now_us, *_runnable(params),
                                  org, share))
                for org in orgs for state in _READY_STATES
            ])))
            rows.sort(key=_ready_order)
        candidates = [Candidate(str(r[0]), str(r[1]), r[2], r[3]) for r in rows]
        if slot < 0:
            # No slots (or a shallow ready set): replicas start at different strides
            # of the oldest window so that they do not all queue on the same row locks.
            strides = max(1, len(candidates) // max(1, params.limit))
            offset = (params.rotation % strides) * params.limit
            candidates = candidates[offset:] + candidates[:offset]
        return pick_batch(candidates, params.limit, params.rotation)

    async def _ready_window(self, tx: SqlTx, params: ClaimParams, window: int, skip: int,
                            now_us: int) -> list[tuple[Any, ...]]:
        """The ``window`` oldest ready rows after the first ``skip`` (pending and retry:
        one statement, each state an arm that skips its own first ``skip`` rows)."""
        rows = await tx.fetchall(*_union_all([
            (_READY_SQL, (state.value, params.family, now_us, *_runnable(params), window,
                          skip))
            for state in _READY_STATES
        ]))
        return sorted(rows, key=_ready_order)[:window]

    async def _ready_part(self, tx: SqlTx, params: ClaimParams, window: int,
                          part: tuple[str, ...], now_us: int, *, newest: bool = False
                          ) -> list[tuple[Any, ...]]:
        """The ``window`` oldest (``newest``: newest) ready rows of a claimant's part
        (work ids ending in one of ``part``; pending and retry in one statement)."""
        sql = _ready_part_sql(len(part[0]), len(part), newest=newest)
        rows = await tx.fetchall(*_union_all([
            (sql, (state.value, params.family, now_us, *_runnable(params), *part, window))
            for state in _READY_STATES
        ]))
        return sorted(rows, key=_ready_order, reverse=newest)[:window]

    async def _ready_arms(self, tx: SqlTx, params: ClaimParams, depth: int,
                          now_us: int) -> list[list[tuple[Any, ...]]]:
        """The ``depth`` oldest ready rows of each ready state, oldest first, one list per
        state (one statement: each arm tags its rows with its index)."""
        rows = await tx.fetchall(*_union_all([
            (_READY_SQL, (state.value, params.family, now_us, *_runnable(params), depth, 0))
            for state in _READY_STATES
        ], tagged=True))
        arms: list[list[tuple[Any, ...]]] = [[] for _ in _READY_STATES]
        for row in rows:
            arms[int(row[-1])].append(tuple(row[:-1]))
        for arm in arms:
            arm.sort(key=_ready_order)
        return arms

    async def work_ready_orgs(self, family: str, now_us: int, limit: int = 64) -> list[str]:
        """Orgs with ready work of ``family``, oldest first (for fair-share claiming): in
        each ready state, the first ``limit`` orgs in org order that have a ready row.

        A walk over the (state, family, org_id, run_after_us) index, one seek per org
        (``_READY_ORG_AFTER_SQL``), not a GROUP BY: MariaDB answers that by reading every
        ready row of the family, and each busy claim loop of every replica asks every
        ``fairness_interval``, so a backlog's whole ready set was read that often."""

        async def body(tx: SqlTx) -> list[str]:
            found: dict[str, int] = {}
            for state in _READY_STATES:
                sql, bound = _READY_ORG_FROM_SQL, ""
                for _ in range(limit):
                    rows = await tx.fetchall(sql, (state.value, family, bound, now_us))
                    if not rows:
                        break
                    org, oldest = str(rows[0][0]), int(rows[0][1])
                    found[org] = min(oldest, found.get(org, oldest))
                    sql, bound = _READY_ORG_AFTER_SQL, org
            return sorted(found, key=lambda o: found[o])[:limit]

        return await self.db.transact(body, name="work.ready_orgs", write=False)

    async def _claim_ids(
        self, tx: SqlTx, ids: list[str], params: ClaimParams, token: str, lease_until: int,
        now_us: int,
    ) -> int:
        head = (params.owner, token, lease_until, now_us)
        try:
            return await tx.execute(
                f"{_CLAIM_SET} WHERE work_id IN ({placeholders(len(ids))}){_CLAIM_WHERE}",
                (*head, *ids, now_us, params.family),
            )
        except DuplicateKey:
            pass  # a target lane is held by now: claim row by row, skip the conflict
        won = 0
        for work_id in ids:
            try:
                won += await tx.execute(
                    f"{_CLAIM_SET} WHERE work_id = ?{_CLAIM_WHERE}",
                    (*head, work_id, now_us, params.family),
                )
            except DuplicateKey:
                continue
        return won

    async def _sweep_expired(
        self, tx: SqlTx, params: ClaimParams, rows: list[tuple[Any, ...]], token: str,
        lease_until: int, now_us: int,
    ) -> tuple[list[str], list[Reclaim]]:
        """Reclaim (or, attempts spent, dead-letter) rows whose lease had expired:
        a CAS on the observed fence plus ``lease_until < now``. Each lease this
        transaction superseded is journaled as a ``lease_lost`` execution of its
        previous owner. Returns (reclaimed work ids, every superseded lease)."""
        spent = [r for r in rows if int(r[3]) >= int(r[4])]
        again = [r for r in rows if int(r[3]) < int(r[4])]
        superseded: list[Reclaim] = []
        # Rare (attempts spent and the lease expired): one exact CAS per row, so
        # that only the rows this transaction moved are reported and journaled.
        for r in spent:
            fence = _expired_fence(r)
            where, args = fence_predicate([fence])
            if await tx.execute(
                "UPDATE work_items SET state = 'dead', lease_until_us = NULL,"
                " target_lane_hold = NULL, terminal_outcome = 'dead',"
                " failure_class = 'lease_expired', operator_summary = ?,"
                " ownership_epoch = ownership_epoch + 1, row_version = row_version + 1,"
                f" updated_at_us = ? WHERE {where} AND state = 'processing'"
                " AND lease_until_us < ?",
                ("lease expired with attempts exhausted", now_us, *args, now_us),
            ):
                superseded.append(_reclaim(r, dead=True))
        if again:
            fences = [_expired_fence(r) for r in again]
            where, args = fence_predicate(fences)
            matched = await tx.execute(
                f"{_CLAIM_SET} WHERE {where} AND state = 'processing' AND lease_until_us < ?"
                f"{CLAIM_ADMITTED}",
                (params.owner, token, lease_until, now_us, *args, now_us, params.family),
            )
            won = {str(r[0]) for r in again}
            if matched != len(again):  # another sweeper took some first
                won = {str(w) for (w,) in await tx.fetchall(
                    f"SELECT work_id FROM work_items WHERE work_id IN"
                    f" ({placeholders(len(again))}) AND lease_token = ?",
                    (*(r[0] for r in again), token),
                )}
            superseded.extend(_reclaim(r, dead=False) for r in again if str(r[0]) in won)
        await journal_rows(tx, [
            journal_entry(c.work_id, c.superseded_epoch, params.family, c.attempt,
                          c.previous_owner, LEASE_LOST, now_us, params.owner)
            for c in superseded
        ])
        return [c.work_id for c in superseded if not c.dead], superseded

    async def _reconcile_claim(self, ids: list[str], token: str,
                               lease_ttl_us: int) -> list[WorkItem]:
        """Read back a claim whose COMMIT outcome is unknown: the rows carrying our
        token are ours. The database that lost the reply is often still going away
        (a restart, a failover), so the read is retried with backoff for up to half
        the lease: a batch that did commit is run, not left to lease expiry."""
        give_up_at = trio.current_time() + lease_ttl_us / 2_000_000
        pause = RECONCILE_FIRST_PAUSE_S
        while True:
            try:
                return await self._read_by_token(ids, token)
            except StorageError:
                if trio.current_time() + pause >= give_up_at:
                    raise
            await trio.sleep(pause)
            pause = min(pause * 2, RECONCILE_MAX_PAUSE_S)

    async def _read_by_token(self, ids: list[str], token: str) -> list[WorkItem]:
        if not ids:
            return []

        async def body(tx: SqlTx) -> list[WorkItem]:
            rows = await tx.fetchall(
                f"{SELECT_WORK} WHERE work_id IN ({placeholders(len(ids))})"
                " AND lease_token = ? AND state = 'processing'",
                (*ids, token),
            )
            return [from_row(r) for r in rows]

        return await self.db.transact(body, name="work.claim.reconcile", write=False)

    async def work_renew_if_owner(
        self, fences: Sequence[Fence], lease_ttl_us: int, now: Callable[[], int]
    ) -> RenewResult:
        return await self.work_renew_groups([RenewGroup(tuple(fences), lease_ttl_us)], now)

    async def work_renew_groups(
        self, groups: Sequence[RenewGroup], now: Callable[[], int]
    ) -> RenewResult:
        """Renew every group's fences (each for its own TTL) in one transaction of one
        UPDATE: the lease keeper's renewals of all families are one round trip on the
        reserved ``work.renew`` connection, never one family's after another's.

        ``now`` is read inside the transaction: a lease is renewed only if it is still
        live when the UPDATE runs (a time read before a wait for the connection, or a
        freeze, would revive a lease that had ended meanwhile), and for its TTL from
        then."""
        ttl: dict[str, int] = {}
        fences: list[Fence] = []
        for group in groups:
            for fence in group.fences:
                if fence.work_id not in ttl:
                    ttl[fence.work_id] = group.lease_ttl_us
                    fences.append(fence)
        if not fences:
            return RenewResult(renewed={}, lost=[], cancel_requested=[])
        where, args = fence_predicate(fences)
        ttls = sorted(set(ttl.values()))
        until: dict[str, int] = {}

        async def body(tx: SqlTx) -> list[tuple[Any, ...]]:
            now_us = now()
            until.clear()
            until.update({w: now_us + t for w, t in ttl.items()})
            set_args: list[Any] = []
            if len(ttls) == 1:
                set_until = "?"
                set_args.append(now_us + ttls[0])
            else:  # one arm per TTL (the WHERE names only these ids: the ELSE is never taken)
                arms: list[str] = []
                for value in ttls:
                    ids = [w for w, t in ttl.items() if t == value]
                    arms.append(f"WHEN work_id IN ({placeholders(len(ids))}) THEN ?")
                    set_args.extend((*ids, now_us + value))
                set_until = f"CASE {' '.join(arms)} ELSE lease_until_us END"
            await tx.execute(
                f"UPDATE work_items SET lease_until_us = {set_until},"
                " row_version = row_version + 1,"
                f" updated_at_us = ? WHERE {where} AND state = 'processing'"
                " AND lease_until_us >= ?",
                (*set_args, now_us, *args, now_us),
            )
            return await tx.fetchall(
                "SELECT work_id, lease_token, ownership_epoch, state, lease_until_us,"
                f" cancel_requested FROM work_items WHERE {where}",
                args,
            )

        try:
            rows = await self.db.transact(body, name="work.renew")
        except CommitOutcomeUnknown:
            # Unknown renewals are treated as not renewed: the local deadline
            # keeps running from the last *known* renewal.
            return RenewResult(renewed={}, lost=[], cancel_requested=[])
        by_id = {str(r[0]): r for r in rows}
        renewed: dict[str, int] = {}
        lost: list[Fence] = []
        cancel: list[Fence] = []
        for fence in fences:
            row = by_id.get(fence.work_id)
            expected = until[fence.work_id]
            if row is None or row[3] != "processing" or int(row[4] or 0) != expected:
                lost.append(fence)
                continue
            renewed[fence.work_id] = expected
            if row[5]:
                cancel.append(fence)
        return RenewResult(renewed=renewed, lost=lost, cancel_requested=cancel)

    async def work_finalize_if_owner(
        self,
        finalizations: Sequence[Finalization],
        replica: str,
        now: Callable[[], int],
        side_writes: Mapping[str, SideWrite] | None = None,
    ) -> list[FinalizeResult]:
        """Finalize many items in one transaction, each against its own fence.

        ``now`` is read inside the transaction, when its statements run: each fence
        is judged then (a time read before a wait for a connection, or a freeze,
        would let a claimant whose lease ended meanwhile record its outcome).

        ``side_writes`` maps a work id to writes that must commit atomically
        with that item's finalization (an effect's outcome and settlement, a
        receipt's confirmation). They run only if the item's fence held. If a
        write fails, the whole transaction is rolled back and run again with
        each such item under its own savepoint, so that only the failing item
        is left out (its result carries the error). Results come back in
        input order.
        """
        if not finalizations:
            return []
        extra = side_writes or {}
        groups: dict[tuple[Any, ...], list[Finalization]] = {}
        for fin in finalizations:
            if fin.fence.work_id not in extra:
                groups.setdefault(_set_values(fin), []).append(fin)
        special = [f for f in finalizations if f.fence.work_id in extra]

        async def body(tx: SqlTx, *, isolate: bool) -> list[FinalizeResult]:
            now_us = now()
            results: dict[str, FinalizeResult] = {}
            journal: list[tuple[Any, ...]] = []
            for key, members in groups.items():
                applied = await _finalize_group(tx, key, members, now_us)
                for m in members:
                    ok = m.fence.work_id in applied
                    results[m.fence.work_id] = FinalizeResult(
                        m.fence, ok, WorkState(key[0]) if ok else None)
                    if ok:
                        journal.extend(_journal_entry(m, replica, now_us))
            if special and isolate:
                journal.extend(await _finalize_isolated(tx, special, extra, results, replica,
                                                        now_us))
            elif special:
                # Optimistic: the side writes that can wait are coalesced, one statement
                # per kind of row (storage.coalesce); any failure redoes it all isolated.
                batch = Coalescing(tx)
                try:
                    journal.extend(await _finalize_items(batch, special, extra, results,
                                                         replica, now_us))
                    await batch.flush()
                except StorageError as exc:
                    raise _SideWriteFailed() from exc
            if journal:
                await journal_rows(tx, journal)
            return [results[f.fence.work_id] for f in finalizations]

        async def optimistic(tx: SqlTx) -> list[FinalizeResult]:
            return await body(tx, isolate=False)

        async def isolated(tx: SqlTx) -> list[FinalizeResult]:
            return await body(tx, isolate=True)

        try:
            try:
                return await self.db.transact(optimistic, name="work.finalize")
            except _SideWriteFailed:
                # Some item's writes failed: nothing was committed. Again, with each
                # item under its own savepoint, so only the failing one is left out.
                return await self.db.transact(isolated, name="work.finalize")
        except CommitOutcomeUnknown:
            return await self._reconcile_finalize(finalizations)

    async def _reconcile_finalize(
        self, finalizations: Sequence[Finalization]
    ) -> list[FinalizeResult]:
        """Read back a finalization whose COMMIT outcome is unknown. The row still under
        our fence in the new state says it committed; so does our epoch's journal row
        with the outcome we wrote (written in the same transaction), which outlives the
        fence: a retried or deferred item may already be claimed again by another
        replica when the read comes (seed 78). A release is not journaled: only the
        fence can tell, and once the row moved on it is answered not applied."""
        fences = [f.fence for f in finalizations]

        async def body(tx: SqlTx) -> tuple[dict[str, tuple[Any, ...]], set[tuple[str, int]]]:
            where, args = fence_predicate(fences)
            rows = await tx.fetchall(
                f"SELECT work_id, state FROM work_items WHERE {where}", args
            )
            found = {str(r[0]): r for r in rows}
            gone = [f for f in finalizations if f.fence.work_id not in found
                    and f.event is not WorkEvent.RELEASE]
            if not gone:
                return found, set()
            journaled = await tx.fetchall(
                "SELECT work_id, ownership_epoch, outcome FROM work_executions WHERE "
                + " OR ".join(["(work_id = ? AND ownership_epoch = ?)"] * len(gone)),
                tuple(v for f in gone for v in (f.fence.work_id, f.fence.ownership_epoch)))
            expected = {(f.fence.work_id, f.fence.ownership_epoch): _journal_outcome(f)
                        for f in gone}
            return found, {(str(r[0]), int(r[1])) for r in journaled
                           if expected.get((str(r[0]), int(r[1]))) == r[2]}

        rows, committed = await self.db.transact(body, name="work.finalize.reconcile",
                                                 write=False)
        out = []
        for fin in finalizations:
            row = rows.get(fin.fence.work_id)
            ok = ((row is not None and row[1] == fin.new_state.value)
                  or (fin.fence.work_id, fin.fence.ownership_epoch) in committed)
            out.append(FinalizeResult(fin.fence, ok, fin.new_state if ok else None))
        return out

    async def work_fenced(
        self, fence: Fence, now: Callable[[], int], body: Callable[[SqlTx], Awaitable[T]], *,
        name: str
    ) -> T:
        """Run ``body`` in one transaction that first proves the live fence, judged at
        ``now`` read inside the transaction (not at a time read before it)."""

        async def fenced(tx: SqlTx) -> T:
            await fence_lock(tx, fence, now())
            return await body(tx)

        return await self.db.transact(fenced, name=name)


def _union_all(arms: Sequence[tuple[str, tuple[Any, ...]]], *,
               tagged: bool = False) -> tuple[str, tuple[Any, ...]]:
    """Several ordered, limited SELECTs of the same columns as one statement (one round
    trip). Each arm is a derived table, so that it keeps its own ORDER BY and LIMIT, and
    its index plan, on SQLite and MySQL alike. ``tagged``: each row ends with its arm's
    index."""
    sql = " UNION ALL ".join(f"SELECT r{i}.*{f', {i}' if tagged else ''} FROM ({arm}) r{i}"
                             for i, (arm, _) in enumerate(arms))
    return sql, tuple(v for _, args in arms for v in args)


def _ready_order(row: tuple[Any, ...]) -> tuple[int, str]:
    return int(row[4]), str(row[0])


def _runnable(params: ClaimParams) -> tuple[int, int]:
    """The claimant's (engine capability, payload schema) bounds, as SQL arguments."""
    return params.engine_capability_version, params.payload_schema_version


def _expired_fence(row: tuple[Any, ...]) -> Fence:
    return Fence(str(row[0]), str(row[1]), int(row[2]))


def _reclaim(row: tuple[Any, ...], *, dead: bool) -> Reclaim:
    return Reclaim(work_id=str(row[0]), superseded_epoch=int(row[2]), attempt=int(row[3]),
                   previous_owner=str(row[5] or ""), dead=dead)


class _SideWriteFailed(Exception):
    """A side write failed on the optimistic path: roll back, redo isolated."""


async def _finalize_isolated(
    tx: SqlTx,
    special: list[Finalization],
    extra: Mapping[str, SideWrite],
    results: dict[str, FinalizeResult],
    replica: str,
    now_us: int,
) -> list[tuple[Any, ...]]:
    """Items with side writes, one savepoint each: a failing item (with its
    writes) is rolled back and reported; the others go on."""
    journal: list[tuple[Any, ...]] = []
    for i, fin in enumerate(special):
        await tx.execute(f"SAVEPOINT fin_{i}")
        try:
            entries = await _finalize_items(tx, [fin], extra, results, replica, now_us)
            await tx.execute(f"RELEASE SAVEPOINT fin_{i}")
        except StorageError as exc:
            await tx.execute(f"ROLLBACK TO SAVEPOINT fin_{i}")
            results[fin.fence.work_id] = FinalizeResult(fin.fence, False, None, error=str(exc))
            continue
        # Journaled only once its savepoint is released: a release that failed rolled
        # the finalization back, and its journal row must not outlive it (seed 204).
        journal.extend(entries)
    return journal


async def _finalize_items(
    tx: SqlTx,
    items: list[Finalization],
    extra: Mapping[str, SideWrite],
    results: dict[str, FinalizeResult],
    replica: str,
    now_us: int,
) -> list[tuple[Any, ...]]:
    journal: list[tuple[Any, ...]] = []
    groups: dict[tuple[Any, ...], list[Finalization]] = {}
    for fin in items:
        groups.setdefault(_set_values(fin), []).append(fin)
    for key, members in groups.items():
        applied = await _finalize_group(tx, key, members, now_us)
        for fin in members:
            if fin.fence.work_id in applied:
                # The fence held (the row is locked until COMMIT): its writes may run.
                await extra[fin.fence.work_id](tx)
                results[fin.fence.work_id] = FinalizeResult(fin.fence, True, WorkState(key[0]))
                journal.extend(_journal_entry(fin, replica, now_us))
            else:
                results[fin.fence.work_id] = FinalizeResult(fin.fence, False, None)
    return journal


async def _finalize_group(tx: SqlTx, key: tuple[Any, ...], members: Sequence[Finalization],
                          now_us: int) -> set[str]:
    """One fenced UPDATE for items going to the same values; the work ids it applied to."""
    fences = [m.fence for m in members]
    if await _finalize_update(tx, key, fences, now_us) == len(members):
        return {m.fence.work_id for m in members}
    return await _applied(tx, fences, key[0])


def _set_values(fin: Finalization) -> tuple[Any, ...]:
    return (
        fin.new_state.value,
        fin.run_after_us,
        fin.terminal_outcome,
        fin.failure_class,
        fin.summary,
        1 if fin.refund_attempt else 0,
    )


async def _finalize_update(tx: SqlTx, key: tuple[Any, ...], fences: Sequence[Fence],
                           now_us: int) -> int:
    state, run_after, terminal, failure, summary, refund = key
    where, args = fence_predicate(fences)
    return await tx.execute(
        "UPDATE work_items SET state = ?, lease_until_us = NULL,"
        " target_lane_hold = NULL, run_after_us = COALESCE(?, run_after_us),"
        " terminal_outcome = ?, failure_class = ?, operator_summary = ?,"
        " attempt = attempt - ?, row_version = row_version + 1, updated_at_us = ?"
        f" WHERE {where} AND state = 'processing' AND lease_until_us >= ?",
        (state, run_after, terminal, failure, summary, refund, now_us, *args, now_us),
    )


def _journal_outcome(fin: Finalization) -> str:
    # A deferral is refunded, but journaled: every wait is visible, with its reason.
    return DEFERRED if fin.event is WorkEvent.DEFER else fin.new_state.value


def _journal_entry(fin: Finalization, replica: str, now_us: int) -> list[tuple[Any, ...]]:
    if fin.event is WorkEvent.RELEASE:
        return []  # a released attempt is refunded, not an execution
    outcome = _journal_outcome(fin)
    return [journal_entry(fin.fence.work_id, fin.fence.ownership_epoch, fin.family,
                          fin.attempt, replica, outcome, now_us, reason=fin.failure_class)]


async def _applied(tx: SqlTx, fences: Sequence[Fence], state: str) -> set[str]:
    """Which fenced rows now show ``state`` under the same token and epoch (ours)."""
    where, args = fence_predicate(fences)
    rows = await tx.fetchall(f"SELECT work_id, state FROM work_items WHERE {where}", args)
    return {str(r[0]) for r in rows if r[1] == state}
