"""The effect journal (DoOnce) and Runtime result receipts.

Theory of operation
-------------------
Every write here happens while the caller holds the live WorkItem fence:
inside :func:`storage.work_claims.fence_lock`'s transaction (the store
methods), or, for the in-transaction functions, in the fenced finalization
of the item (``WorkContext.on_finalize``) or ``WorkStore.work_fenced``:

* ``effect_checkpoint``: the durable dispatch-start checkpoint, written and
  committed *before* any byte leaves. One attempt per claim epoch (unique
  ``(work_id, ownership_epoch)``); refused if the command is settled, an
  earlier attempt is still unresolved (dispatched with no proven outcome), an
  operator cancelled its work, or any pin the request was built for is no
  longer current (:class:`DispatchRefused`, with the stable code of
  :func:`daemon.core.effect_step.checkpoint_refusal`): the binding's durable
  generation and state, the link's state, generation and remote id, the
  pinned Catalog revision as stored. Those are read by the checkpoint's own
  statement, in its transaction, after the fence locked the item: a
  reconnect, a reinstall or a link rebind committed at any moment before it
  stops the attempt, however long the claim waited (for a token refresh, a
  quota slot) since it read its context.
* ``record_outcome``: the one terminal classification of that attempt.
* ``effect_dispose``: reconciliation's (or an operator's) disposition of an
  unresolved attempt: proven applied or proven absent. It never edits the
  attempt's request or its original outcome.
* ``settle``: persist the command's terminal result (success with a
  RemoteID, or ``ResourceNoEffectResultV1``), forbid further dispatch, and
  create the receipt and the WorkItem that delivers it, atomically.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from daemon.core.effect_step import CommandView, DispatchPins, LinkView, checkpoint_refusal
from daemon.core.handoff import (
    NO_EFFECT_INTENT_KINDS,
    RESULT_FORMAT_NO_EFFECT,
    commit_result_request,
)
from daemon.core.operator_paths import Action, Refused
from daemon.core.work import Fence, WorkSpec
from storage.bounded import BoundedCount, bounded_count
from storage.coalesce import RowUpdate, coalescing
from storage.commands import COMMAND_COLUMNS, command_from_row, read_command
from storage.effect_values import (
    AttemptDraft,
    BindingNow,
    Command,
    Disposition,
    EffectAttempt,
    Kin,
    ReceiptState,
    RemoteLink,
    ResultReceipt,
    Settlement,
)
from storage.history_flow import count_receipt
from storage.idgen import new_ulid
from storage.links import link_from_row, link_select
from storage.operator_refusal import ActionRefused
from storage.port import (
    AuditEntry,
    Database,
    DuplicateKey,
    LostLease,
    Row,
    SqlTx,
    StorageError,
    WorkConflict,
)
from storage.repair_lineage import receipt_target
from storage.work_admin import CancelRequested, append_audit, insert_work
from storage.work_claims import fence_lock, fence_lock_many
from storage.work_rows import placeholders

RECEIPT_FAMILY = "runtime_receipt"

_ATTEMPT_COLUMNS = (
    "attempt_id, command_id, work_id, ownership_epoch, method, target_path, safe_headers,"
    " body_sha256, idempotency_key, pre_dispatch_evidence, dispatch_started_at_us,"
    " response_status, provider_evidence, outcome, failure_class, finished_at_us,"
    " disposition, disposition_note, disposition_by, disposition_at_us, evidence,"
    " gave_up_at_us"
)
# Each command's settlement, how many of its attempts are unresolved, whether an
# operator asked its running WorkItem to stop, its pins, and each pinned target as it
# is now (the binding's generation and state, the link's state, generation and remote
# id, the stored digest of the pinned Catalog revision), in one read. (Read after the
# fence's UPDATE locked the item's row: a cancel request committed before it is seen,
# and one made after it finds the checkpoint and is refused. Every backend reads the
# latest committed rows here: SQLite's writers are serial, MariaDB runs READ COMMITTED,
# Galera nodes run with causal reads, wsrep_sync_wait = 1.)
_DISPATCHABLE_SQL = (
    "SELECT c.command_id, c.settlement, (SELECT COUNT(*) FROM effect_attempts a"
    " WHERE a.command_id = c.command_id AND a.disposition IS NULL"
    " AND (a.outcome IS NULL OR a.outcome = 'OUTCOME_UNKNOWN')),"
    " (SELECT COUNT(*) FROM work_items w WHERE w.subject_kind = 'command'"
    " AND w.subject_id = c.command_id AND w.state = 'processing' AND w.cancel_requested = 1),"
    " c.intent_kind, c.principal_generation, c.link_key, c.link_generation, c.remote_id,"
    " c.catalog_revision, c.catalog_digest, p.generation, p.state,"
    " l.state, l.generation, l.remote_id, r.digest"
    " FROM external_commands c"
    " LEFT JOIN principal_bindings p ON p.binding_id = c.binding_id"
    " LEFT JOIN remote_links l ON l.link_key = c.link_key"
    " LEFT JOIN catalog_revisions r ON r.revision = c.catalog_revision"
    " WHERE c.command_id IN ({marks})"
)
# An attempt left with no outcome after its checkpoint: undisposed, and the claim
# that made it no longer holds its WorkItem (killed, drained, lease lost, or
# cancelled mid-dispatch). While that claim is live the attempt is in flight.
# Not while the claim that made the attempt is still processing. A correlated lookup of
# the attempt's own work item by primary key (one probe per attempt read), not NOT EXISTS:
# MariaDB turned that into a materialized set of every processing item (41,622 rows in
# the issue 23 scratch load: 260 ms per list or count whatever its LIMIT).
_LEFT_WITHOUT_OUTCOME = (
    "outcome IS NULL AND disposition IS NULL AND COALESCE((SELECT w.state = 'processing'"
    " AND w.ownership_epoch = effect_attempts.ownership_epoch FROM work_items w"
    " WHERE w.work_id = effect_attempts.work_id), 0) = 0"
)
# The unresolved-attempt counts stop here (the console says "more than"; the gauge
# saturates): an operator works that queue from its oldest entry, one attempt at a time.
UNRESOLVED_CAP = 1000
_INSERT_ATTEMPT_SQL = (
    f"INSERT INTO effect_attempts ({_ATTEMPT_COLUMNS}, lease_token, row_version)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, ?, ?, 0)"
)
_RECEIPT_COLUMNS = (
    "command_id, intent_id, result_format_version, remote_id, canonical_result,"
    " result_digest, state, last_error, created_at_us, confirmed_at_us"
)


def _int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def attempt_from_row(row: Row) -> EffectAttempt:
    return EffectAttempt(
        attempt_id=str(row[0]), command_id=str(row[1]), work_id=str(row[2]),
        ownership_epoch=int(row[3]), method=str(row[4]), target_path=str(row[5]),
        safe_headers=str(row[6]), body_sha256=str(row[7]), idempotency_key=str(row[8]),
        pre_dispatch_evidence=str(row[9]), dispatch_started_at_us=int(row[10]),
        response_status=_int(row[11]), provider_evidence=_str(row[12]), outcome=_str(row[13]),
        failure_class=_str(row[14]), finished_at_us=_int(row[15]), disposition=_str(row[16]),
        disposition_note=_str(row[17]), disposition_by=_str(row[18]),
        disposition_at_us=_int(row[19]), evidence=_str(row[20]), gave_up_at_us=_int(row[21]),
    )


class DispatchRefused(WorkConflict):
    """The dispatch checkpoint refused the attempt because a pin its request was built
    for is no longer current (or the draft carried none): nothing was written, no byte
    may leave. ``code`` is stable (:func:`daemon.core.effect_step.checkpoint_refusal`);
    ``sentence`` says why."""

    def __init__(self, command_id: str, code: str, sentence: str) -> None:
        super().__init__(f"command {command_id}: {code}: {sentence}")
        self.code = code
        self.sentence = sentence


@attrs.frozen
class _Dispatchable:
    """One command as the checkpoint's statement found it."""

    settlement: str
    unresolved: int
    cancel: int
    command: CommandView
    binding: BindingNow | None
    link: LinkView | None
    stored_digest: str | None


def _dispatchable(row: Row) -> _Dispatchable:
    link = None if row[13] is None else LinkView(
        state=str(row[13]), generation=int(str(row[14])), remote_id=_str(row[15]))
    return _Dispatchable(
        settlement=str(row[1]), unresolved=int(str(row[2])), cancel=int(str(row[3])),
        command=CommandView(
            command_id=str(row[0]), settlement=str(row[1]), intent_kind=str(row[4]),
            binding_generation=_int(row[5]), link_key=_str(row[6]),
            link_generation=_int(row[7]), remote_id=_str(row[8]),
            catalog_revision=int(str(row[9])), catalog_digest=str(row[10] or "")),
        binding=_binding_now(row[11], row[12]), link=link, stored_digest=_str(row[16]))


def _dispatch_refusal(command_id: str, found: _Dispatchable | None,
                      sent: DispatchPins | None) -> WorkConflict | None:
    """Why no attempt may start, from the command's settlement, unresolved attempts,
    cancel request and pins as the checkpoint's statement read them."""
    if found is None:
        return WorkConflict(f"no command {command_id}")
    if found.settlement != Settlement.OPEN:
        return WorkConflict(f"command {command_id} is {found.settlement}; no further dispatch")
    if found.unresolved:
        return WorkConflict(f"command {command_id} has an unresolved attempt")
    if found.cancel:
        return CancelRequested(f"command {command_id}: an operator cancelled its work")
    if sent is None:
        return DispatchRefused(command_id, "dispatch_unpinned", "the request carries no"
                               " pins; nothing is sent with an unchecked identity")
    refusal = checkpoint_refusal(found.command, sent, found.binding, found.link,
                                 found.stored_digest)
    if refusal is not None:
        return DispatchRefused(command_id, *refusal)
    return None


def _attempt_params(attempt_id: str, fence: Fence, draft: AttemptDraft,
                    now_us: int) -> tuple[Any, ...]:
    return (attempt_id, draft.command_id, fence.work_id, fence.ownership_epoch, draft.method,
            draft.target_path, draft.safe_headers, draft.body_sha256, draft.idempotency_key,
            draft.pre_dispatch_evidence, now_us,
            # Until the outcome is recorded, the client's own deadline bounds when
            # it gives up on the exchange (a crash or a kill records nothing).
            now_us + draft.give_up_after_us, fence.lease_token)


def receipt_from_row(row: Row) -> ResultReceipt:
    return ResultReceipt(
        command_id=str(row[0]), intent_id=str(row[1]), result_format_version=int(row[2]),
        remote_id=str(row[3]), canonical_result=str(row[4]), result_digest=str(row[5]),
        state=ReceiptState(row[6]), last_error=row[7], created_at_us=int(row[8]),
        confirmed_at_us=int(row[9]) if row[9] is not None else None,
    )


async def read_receipt(tx: SqlTx, command_id: str) -> ResultReceipt | None:
    rows = await tx.fetchall(
        f"SELECT {_RECEIPT_COLUMNS} FROM result_receipts WHERE command_id = ?", (command_id,)
    )
    return receipt_from_row(rows[0]) if rows else None


# The unresolved attempts of a kin's items (issue 22), read from the few unresolved
# attempts (effect_attempts_outcome) to their item by primary key. An operator's replay
# of a kin item is kin too: it has no dedupe key (``replay_of`` names what it replays),
# so any replay of the family's subjects in the lane counts (simulation seed 35: a
# replayed create in doubt let the next run's create send). Counting a replay of another
# key prefix's step holds a checkpoint longer, never sends beside one in doubt.
_KIN_UNRESOLVED = (
    " FROM effect_attempts a JOIN work_items w ON w.work_id = a.command_id"
    " WHERE a.disposition IS NULL AND (a.outcome IS NULL OR a.outcome = 'OUTCOME_UNKNOWN')"
    " AND w.family = ? AND w.subject_kind = ? AND w.source_lane = ?"
    " AND (SUBSTR(w.dedupe_key, 1, ?) = ? OR (w.dedupe_key IS NULL"
    " AND w.replay_of IS NOT NULL))"
)


def _kin_params(kin: Kin) -> tuple[Any, ...]:
    return (kin.family, kin.subject_kind, kin.lane, len(kin.key_prefix), kin.key_prefix)


async def unresolved_of_kin(tx: SqlTx, kin: Kin) -> list[EffectAttempt]:
    """Every unresolved attempt of the kin's items, whatever state each item is in."""
    columns = ", ".join(f"a.{c.strip()}" for c in _ATTEMPT_COLUMNS.split(","))
    rows = await tx.fetchall(
        f"SELECT {columns}{_KIN_UNRESOLVED} AND w.subject_id = ?"
        " ORDER BY a.dispatch_started_at_us, a.attempt_id", (*_kin_params(kin), kin.subject_id))
    return [attempt_from_row(r) for r in rows]


async def subjects_in_doubt(tx: SqlTx, kin: Kin) -> list[tuple[str, str, str]]:
    """(subject, item state, the attempt's pre-dispatch evidence) of every unresolved
    attempt of an item of the kin's family, lane and key prefix (any subject)."""
    rows = await tx.fetchall(
        f"SELECT w.subject_id, w.state, a.pre_dispatch_evidence{_KIN_UNRESOLVED}",
        _kin_params(kin))
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


async def attempts_of(tx: SqlTx, command_id: str) -> list[EffectAttempt]:
    rows = await tx.fetchall(
        f"SELECT {_ATTEMPT_COLUMNS} FROM effect_attempts WHERE command_id = ?"
        " ORDER BY dispatch_started_at_us, attempt_id",
        (command_id,),
    )
    return [attempt_from_row(r) for r in rows]


_CONTEXT_SQL = (
    "SELECT {command}, (SELECT COUNT(*) FROM effect_attempts a"
    " WHERE a.command_id = c.command_id), p.generation, p.state, {link}"
    " FROM external_commands c LEFT JOIN remote_links l ON l.link_key = ?"
    " LEFT JOIN principal_bindings p ON p.binding_id = c.binding_id"
    " WHERE c.command_id = ?"
)


def _binding_now(generation: Any, state: Any) -> BindingNow | None:
    return None if generation is None else BindingNow(int(generation), state == "connected")


# The command, how many attempts it has, the pinned link and the binding, as they are now.
EffectContextRow = tuple[Command, int, RemoteLink | None, BindingNow | None]


async def read_effect_context(tx: SqlTx, command_id: str,
                              link_key: str) -> EffectContextRow | None:
    """The command, how many attempts it has, the link at ``link_key`` and its
    binding's durable generation and state: one read."""
    rows = await tx.fetchall(_CONTEXT_SQL.format(
        command=_qualified("c", COMMAND_COLUMNS), link=link_select("l")),
        (link_key, command_id))
    if not rows:
        return None
    row = rows[0]
    width = len(COMMAND_COLUMNS.split(","))
    link_row = row[width + 3:]
    return (command_from_row(row[:width]), int(row[width]),
            link_from_row(link_row) if link_row[0] is not None else None,
            _binding_now(row[width + 1], row[width + 2]))


async def read_binding_now(tx: SqlTx, binding_id: str) -> BindingNow | None:
    rows = await tx.fetchall(
        "SELECT generation, state FROM principal_bindings WHERE binding_id = ?", (binding_id,))
    return _binding_now(rows[0][0], rows[0][1]) if rows else None


async def read_effect_contexts(
    tx: SqlTx, requests: Sequence[tuple[str, str]]
) -> list[EffectContextRow | None]:
    """:func:`read_effect_context` for many (command id, link key) pairs: two reads."""
    if len(requests) == 1:
        return [await read_effect_context(tx, *requests[0])]
    commands = sorted({c for c, _ in requests})
    rows = await tx.fetchall(
        f"SELECT {_qualified('c', COMMAND_COLUMNS)}, (SELECT COUNT(*) FROM effect_attempts a"
        " WHERE a.command_id = c.command_id), p.generation, p.state FROM external_commands c"
        " LEFT JOIN principal_bindings p ON p.binding_id = c.binding_id"
        f" WHERE c.command_id IN ({placeholders(len(commands))})", commands)
    found = {str(r[0]): (command_from_row(r[:-3]), int(r[-3]), _binding_now(r[-2], r[-1]))
             for r in rows}
    keys = sorted({k for _, k in requests if k})
    links: dict[str, RemoteLink] = {}
    if keys:
        for r in await tx.fetchall(
                f"SELECT {link_select()} FROM remote_links"
                f" WHERE link_key IN ({placeholders(len(keys))})", keys):
            link = link_from_row(r)
            links[link.link_key] = link
    out: list[EffectContextRow | None] = []
    for command_id, key in requests:
        hit = found.get(command_id)
        out.append(None if hit is None else (hit[0], hit[1], links.get(key), hit[2]))
    return out


def _qualified(alias: str, columns: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


class EffectJournal:
    db: Database

    async def effect_contexts(self, requests: Sequence[tuple[str, str]]
                              ) -> list[EffectContextRow | None]:
        """Many handlers' context reads at once (see :func:`read_effect_contexts`)."""

        async def body(tx: SqlTx) -> list[EffectContextRow | None]:
            return await read_effect_contexts(tx, requests)

        return await self.db.transact(body, name="effect.contexts", write=False)

    async def effect_attempts(self, command_id: str) -> list[EffectAttempt]:
        async def body(tx: SqlTx) -> list[EffectAttempt]:
            return await attempts_of(tx, command_id)

        return await self.db.transact(body, name="effect.attempts", write=False)

    async def effect_checkpoint(self, fence: Fence, draft: AttemptDraft,
                                now: Callable[[], int]) -> str:
        """Write the dispatch-start checkpoint (fenced). Commit it before dispatching."""
        (answer,) = await self.effect_checkpoint_many([(fence, draft)], now)
        if isinstance(answer, StorageError):
            raise answer
        return answer

    async def effect_checkpoint_many(
        self, requests: Sequence[tuple[Fence, AttemptDraft]], now: Callable[[], int]
    ) -> list[str | StorageError]:
        """Many handlers' checkpoints in one transaction (group commit).

        One answer per request, in order: the attempt id, or the error that
        :meth:`effect_checkpoint` would have raised for that request alone
        (``LostLease``, ``WorkConflict``); only those checkpoints are left out.
        Errors of the transaction itself (database unreachable, unknown
        COMMIT) are raised and concern every request.

        ``now`` is read inside the transaction, when its statements run: the fences
        are judged then, not at a time read before a wait for a connection (or the
        batcher's window, or a freeze), which would let a claimant whose lease ended
        meanwhile write its checkpoint and send.
        """
        if not requests:
            return []

        async def body(tx: SqlTx) -> list[str | StorageError]:
            now_us = now()
            ids = [new_ulid(now_us) for _ in requests]
            answers: list[str | StorageError] = list(ids)
            live = await fence_lock_many(tx, [fence for fence, _ in requests], now_us)
            wanted = [d.command_id for fence, d in requests if fence.work_id in live]
            state: dict[str, _Dispatchable] = {}
            if wanted:
                unique = sorted(set(wanted))
                rows = await tx.fetchall(
                    _DISPATCHABLE_SQL.format(marks=placeholders(len(unique))), unique)
                state = {str(r[0]): _dispatchable(r) for r in rows}
            inserts = []
            for i, (fence, draft) in enumerate(requests):
                refusal = (LostLease(fence) if fence.work_id not in live
                           else _dispatch_refusal(draft.command_id,
                                                  state.get(draft.command_id), draft.pins))
                if refusal is not None:
                    answers[i] = refusal
                    continue
                # A second request for one command in one batch finds the first unresolved.
                state[draft.command_id] = attrs.evolve(state[draft.command_id], unresolved=1)
                inserts.append(_attempt_params(ids[i], fence, draft, now_us))
            await tx.executemany(_INSERT_ATTEMPT_SQL, inserts)
            return answers

        return await self.db.transact(body, name="effect.checkpoint_many")

    async def work_fences_live(self, fences: Sequence[Fence], now: Callable[[], int]
                               ) -> list[StorageError | None]:
        """Prove many claims live in one transaction (a fenced step with nothing else
        to write, such as a receipt delivery): ``None`` for a live fence,
        ``LostLease`` for the others. ``now`` is read inside the transaction."""
        if not fences:
            return []

        async def body(tx: SqlTx) -> list[StorageError | None]:
            live = await fence_lock_many(tx, list(fences), now())
            return [None if f.work_id in live else LostLease(f) for f in fences]

        return await self.db.transact(body, name="work.fences_live")

    async def effect_dispose(
        self,
        fence: Fence,
        attempt_ids: list[str],
        disposition: Disposition,
        note: str,
        now: Callable[[], int],
    ) -> None:
        """Reconciliation's verdict on unresolved attempts (fenced; ``now`` is read
        inside the transaction, so the fence is judged when its statements run)."""

        async def body(tx: SqlTx) -> None:
            now_us = now()
            await fence_lock(tx, fence, now_us)
            await dispose(tx, attempt_ids, disposition, note, "reconciler", now_us)

        await self.db.transact(body, name="effect.dispose")

    async def effect_operator_disposition(
        self,
        *,
        attempt_id: str,
        disposition: Disposition,
        note: str,
        actor: str,
        role: str,
        in_flight_window_us: int,
        now_us: int,
    ) -> EffectAttempt:
        """An operator's repair: attach evidence and mark an unresolved attempt's outcome.

        Only an unresolved attempt can be disposed, once; the attempt's request
        and original classification are never edited. Audited in the same
        transaction. Fenced: refused while a WorkItem of the command is
        ``processing`` (its claimant may be recording the real outcome) and
        until the provider's in-flight window (``in_flight_window_us``, from
        the operation's definition and binding) has passed since the latest
        dispatch or give-up (a request may still be applied until then).
        """
        if disposition not in (Disposition.OPERATOR_APPLIED, Disposition.OPERATOR_ABSENT):
            raise WorkConflict("operators record operator_applied or operator_absent")

        async def body(tx: SqlTx) -> EffectAttempt:
            rows = await tx.fetchall(
                f"SELECT {_ATTEMPT_COLUMNS} FROM effect_attempts WHERE attempt_id = ?",
                (attempt_id,),
            )
            if not rows:
                raise WorkConflict(f"no effect attempt {attempt_id}")
            before = attempt_from_row(rows[0])
            if not before.unresolved:
                raise ActionRefused(before.command_id, Action.DISPOSE, Refused(
                    "no_unresolved_attempt",
                    f"attempt {attempt_id} is not awaiting a disposition"))
            await _disposition_fence(tx, before.command_id, in_flight_window_us, now_us)
            await dispose(tx, [attempt_id], disposition, note, actor, now_us,
                          unless_processing=True)
            await append_audit(tx, AuditEntry(
                audit_id=new_ulid(now_us), at_us=now_us, actor=actor, role=role,
                action="effect.disposition", target_kind="effect_attempt", target_id=attempt_id,
                reason=note,
                before=json.dumps({"attempt_id": attempt_id, "outcome": before.outcome}),
                after=json.dumps({"attempt_id": attempt_id, "disposition": disposition.value}),
            ))
            after = await tx.fetchall(
                f"SELECT {_ATTEMPT_COLUMNS} FROM effect_attempts WHERE attempt_id = ?",
                (attempt_id,),
            )
            return attempt_from_row(after[0])

        return await self.db.transact(body, name="effect.operator_disposition")

    async def effect_unknown_list(self, limit: int = 100) -> list[EffectAttempt]:
        """Attempts awaiting a disposition, oldest first: the operator's repair queue.

        Both kinds: ``OUTCOME_UNKNOWN``, and attempts left with no outcome after
        their checkpoint (their claim ended by a kill, drain, lost lease or
        cancel mid-dispatch: :data:`_LEFT_WITHOUT_OUTCOME`)."""

        async def body(tx: SqlTx) -> list[EffectAttempt]:
            n = max(1, min(limit, 1000))
            unknown = await tx.fetchall(
                f"SELECT {_ATTEMPT_COLUMNS} FROM effect_attempts WHERE disposition IS NULL"
                " AND outcome = 'OUTCOME_UNKNOWN' ORDER BY attempt_id LIMIT ?", (n,))
            left = await tx.fetchall(
                f"SELECT {_ATTEMPT_COLUMNS} FROM effect_attempts WHERE {_LEFT_WITHOUT_OUTCOME}"
                " ORDER BY attempt_id LIMIT ?", (n,))
            found = sorted((attempt_from_row(r) for r in (*unknown, *left)),
                           key=lambda a: a.attempt_id)
            return found[:n]

        return await self.db.transact(body, name="effect.unknown_list", write=False)

    async def effect_attempt_get(self, attempt_id: str) -> EffectAttempt | None:
        async def body(tx: SqlTx) -> EffectAttempt | None:
            rows = await tx.fetchall(
                f"SELECT {_ATTEMPT_COLUMNS} FROM effect_attempts WHERE attempt_id = ?",
                (attempt_id,),
            )
            return attempt_from_row(rows[0]) if rows else None

        return await self.db.transact(body, name="effect.attempt_get", write=False)

    async def effect_unknown_backlog(self) -> int:
        """Attempts awaiting a disposition (both kinds of :meth:`effect_unknown_list`),
        each kind counted up to :data:`UNRESOLVED_CAP` (the gauge saturates there)."""
        unknown, left = await self.effect_unresolved_counts()
        return unknown.n + left.n

    async def effect_unresolved_counts(self, cap: int | None = None
                                       ) -> tuple[BoundedCount, BoundedCount]:
        """(``OUTCOME_UNKNOWN`` attempts, attempts left without an outcome), undisposed,
        each counted up to ``cap`` (default :data:`UNRESOLVED_CAP`) and "more" past it.

        Bounded (issue 23): the exact count read every such attempt, and for those left
        without an outcome a NOT EXISTS on work_items each, 12.7 s at 20M terminal rows.
        An operator repairs them one by one from the oldest; past the cap the figure
        that serves is "more than N". Both read the (outcome, disposition) index."""
        bound = UNRESOLVED_CAP if cap is None else cap

        async def body(tx: SqlTx) -> tuple[BoundedCount, BoundedCount]:
            unknown = await bounded_count(
                tx, "SELECT 1 FROM effect_attempts WHERE outcome = 'OUTCOME_UNKNOWN'"
                " AND disposition IS NULL", (), bound)
            left = await bounded_count(
                tx, f"SELECT 1 FROM effect_attempts WHERE {_LEFT_WITHOUT_OUTCOME}", (), bound)
            return unknown, left

        return await self.db.transact(body, name="effect.unknown_backlog", write=False)

    # ------------------------------------------------------------- receipts

    async def receipt_get(self, command_id: str) -> ResultReceipt | None:
        async def body(tx: SqlTx) -> ResultReceipt | None:
            return await read_receipt(tx, command_id)

        return await self.db.transact(body, name="receipt.get", write=False)

# record_outcome's UPDATE, coalesced (storage.coalesce): the same columns and guard.
_OUTCOME_UPDATE = RowUpdate(
    table="effect_attempts", key="attempt_id",
    columns=("outcome", "evidence", "response_status", "provider_evidence", "failure_class",
             "finished_at_us", "gave_up_at_us", "exchange_excerpt"),
    fixed="row_version = row_version + 1", guard="outcome IS NULL AND disposition IS NULL")
_CONFIRM_UPDATE = RowUpdate(
    table="result_receipts", key="command_id", columns=("confirmed_at_us",),
    fixed="state = 'confirmed', last_error = NULL", guard="state = 'pending'", checked=False)
_ERROR_UPDATE = RowUpdate(table="result_receipts", key="command_id", columns=("last_error",),
                          checked=False)


async def record_outcome(tx: SqlTx, attempt_id: str, *, outcome: str, evidence: str,
                         response_status: int | None, provider_evidence: dict[str, Any],
                         failure_class: str, gave_up_at_us: int, now_us: int,
                         exchange: str | None = None) -> None:
    """Inside the caller's (fenced) transaction: the attempt's one outcome class,
    its evidence, and when the client ended the exchange (answer or give-up).
    ``exchange``: a failed call's redacted, bounded exchange excerpt
    (``daemon.core.exchange_excerpt``), kept in this same statement."""
    values = (outcome, evidence, response_status, json.dumps(provider_evidence, sort_keys=True),
              failure_class or None, now_us, gave_up_at_us, exchange)
    batch = coalescing(tx)
    if batch is not None:  # one UPDATE for the batch, the same guard (storage.coalesce)
        batch.update(_OUTCOME_UPDATE, attempt_id, values)
        return
    if not await tx.execute(
        "UPDATE effect_attempts SET outcome = ?, evidence = ?, response_status = ?,"
        " provider_evidence = ?, failure_class = ?, finished_at_us = ?, gave_up_at_us = ?,"
        " exchange_excerpt = ?,"
        " row_version = row_version + 1 WHERE attempt_id = ? AND outcome IS NULL"
        # Never beside an operator's disposition (the journal cannot say ACCEPTED
        # and operator_absent at once): if one got there first, the finalization fails.
        " AND disposition IS NULL",
        (*values, attempt_id),
    ):
        raise WorkConflict(f"attempt {attempt_id} already has an outcome or a disposition")


async def mark_receipt(tx: SqlTx, command_id: str, *, confirmed: bool, error: str | None,
                       now_us: int) -> None:
    """Inside the caller's (fenced) transaction: a receipt delivery's result."""
    batch = coalescing(tx)
    if batch is not None:  # unchecked, as below
        if confirmed:
            batch.update(_CONFIRM_UPDATE, command_id, (now_us,))
        else:
            batch.update(_ERROR_UPDATE, command_id, ((error or "")[:128],))
        return
    if confirmed:
        if await tx.execute(
            "UPDATE result_receipts SET state = 'confirmed', confirmed_at_us = ?,"
            " last_error = NULL WHERE command_id = ? AND state = 'pending'",
            (now_us, command_id),
        ):
            # The console's history: its latencies, in this same transaction.
            await count_receipt(tx, command_id)
    else:
        await tx.execute(
            "UPDATE result_receipts SET last_error = ? WHERE command_id = ?",
            ((error or "")[:128], command_id),
        )


# An operator's disposition also re-checks, in its UPDATE, that no WorkItem of the
# command is processing (the reconciler disposes under its own live fence).
_NOT_PROCESSING = (
    " AND NOT EXISTS (SELECT 1 FROM work_items w WHERE w.subject_kind = 'command'"
    " AND w.subject_id = effect_attempts.command_id AND w.state = 'processing')"
)


async def _disposition_fence(tx: SqlTx, command_id: str, window_us: int, now_us: int) -> None:
    """Refuse an operator disposition while the command's work runs or a request
    of it may still be in flight at the provider."""
    busy = await tx.fetchall(
        "SELECT work_id FROM work_items WHERE subject_kind = 'command' AND subject_id = ?"
        " AND state = 'processing'", (command_id,))
    if busy:
        raise ActionRefused(command_id, Action.DISPOSE, Refused(
            "live_work",
            f"work {busy[0][0]} is processing: its claimant may still record the attempt's"
            " real outcome; wait until it finishes (or its lease ends)"))
    rows = await tx.fetchall(
        "SELECT MAX(dispatch_started_at_us), MAX(finished_at_us) FROM effect_attempts"
        " WHERE command_id = ?", (command_id,))
    stamps = [int(str(v)) for v in (rows[0] if rows else ()) if v is not None]
    open_until = (max(stamps) if stamps else 0) + max(0, window_us)
    if now_us < open_until:
        raise ActionRefused(command_id, Action.DISPOSE, Refused(
            "in_flight_window",
            "the provider's in-flight window has not passed since the latest dispatch"
            f" (another {(open_until - now_us + 999_999) // 1_000_000} s): a request may"
            " still be applied; record the disposition after that"))


async def dispose(tx: SqlTx, attempt_ids: list[str], disposition: Disposition, note: str,
                  actor: str, now_us: int, *, unless_processing: bool = False) -> None:
    """Record a disposition of attempts whose effect nothing proved: an unknown outcome,
    none after the checkpoint, or a replay-safe retry that may have been applied (which
    reconciliation resolves once its replay proof has lapsed: the provider's retention
    of its idempotency key; rows without evidence read as maybe applied)."""
    guard = _NOT_PROCESSING if unless_processing else ""
    for attempt_id in attempt_ids:
        if not await tx.execute(
            "UPDATE effect_attempts SET disposition = ?, disposition_note = ?,"
            " disposition_by = ?, disposition_at_us = ?, row_version = row_version + 1"
            " WHERE attempt_id = ? AND disposition IS NULL"
            " AND (outcome IS NULL OR outcome = 'OUTCOME_UNKNOWN'"
            " OR (outcome = 'REPLAY_SAFE_RETRY'"
            " AND (evidence IS NULL OR evidence = 'maybe_applied')))" + guard,
            (disposition.value, note[:500], actor, now_us, attempt_id),
        ):
            raise WorkConflict(f"attempt {attempt_id} is not awaiting a disposition")


_INSERT_RECEIPT_SQL = (f"INSERT INTO result_receipts ({_RECEIPT_COLUMNS})"
                       " VALUES (?, ?, ?, ?, ?, ?, 'pending', NULL, ?, NULL)")


def _settle_update(expected: Settlement) -> RowUpdate:
    """settle's UPDATE, coalesced: from ``expected`` only, as row at a time."""
    return RowUpdate(table="external_commands", key="command_id",
                     columns=("settlement", "updated_at_us", "modified_at_us"),
                     guard="settlement = ?", guard_params=(expected.value,))


async def settle(
    tx: SqlTx,
    *,
    command_id: str,
    command: Command | None = None,
    settlement: Settlement,
    result_format_version: int,
    remote_id: str,
    canonical_result: str,
    result_digest: str,
    receipt_max_attempts: int,
    now_us: int,
    modified_at_us: int | None = None,
    expected: Settlement = Settlement.OPEN,
) -> str:
    """Inside the caller's transaction: settle the command and queue its receipt.

    ``command`` (its immutable fields, read earlier) saves a read; the
    conditional UPDATE on ``settlement`` is the check that counts.
    ``modified_at_us``: the remote record's last-modified time the accepted
    change's answer named, kept with the settlement (see
    :func:`storage.links.link_select`). ``expected``: the settlement it moves
    from (``retired`` only for an operator's retire of a command proven applied
    that an earlier build retired without its receipt).
    """
    if command is None:
        command = await read_command(tx, command_id)
    if command is None:
        raise WorkConflict(f"no command {command_id}")
    if (result_format_version == RESULT_FORMAT_NO_EFFECT
            and command.intent_kind not in NO_EFFECT_INTENT_KINDS):
        # Seed 003: only UPSERT and DELETE intents admit a no-effect result.
        raise WorkConflict(f"command {command_id} is a {command.intent_kind} intent: only"
                           " UPSERT and DELETE admit a no-effect result")
    batch = coalescing(tx)
    if batch is not None and command.handoff_key is not None:
        # Coalesced (storage.coalesce), the same guard: a handed-off command's receipt
        # is its own, so nothing below reads what this writes.
        batch.update(_settle_update(expected), command_id,
                     (settlement.value, now_us, modified_at_us))
    elif not await tx.execute(
        "UPDATE external_commands SET settlement = ?, updated_at_us = ?, modified_at_us = ?"
        " WHERE command_id = ? AND settlement = ?",
        (settlement.value, now_us, modified_at_us, command_id, expected.value),
    ):
        raise WorkConflict(f"command {command_id} is already settled")
    # The receipt answers the lineage's root (the handed-off command): a repair
    # command's exact result, bound to the original intent and command id.
    target = await receipt_target(tx, command, settlement)
    if target is None:
        return ""  # nothing proven for the Runtime intent: it stays blocking, visibly
    command, lineage_result = target
    command_id = command.command_id
    if lineage_result is not None:
        canonical_result = lineage_result.canonical.decode()
        result_digest = lineage_result.digest
    receipt = (command_id, command.intent_id, result_format_version, remote_id,
               canonical_result, result_digest, now_us)
    try:
        if batch is not None:  # a duplicate fails the batch, redone row at a time
            batch.insert(_INSERT_RECEIPT_SQL, receipt)
        else:
            await tx.execute(_INSERT_RECEIPT_SQL, receipt)
    except DuplicateKey:
        raise WorkConflict(f"command {command_id} already has a Runtime receipt") from None
    (work,) = await insert_work(
        tx,
        [WorkSpec(
            family=RECEIPT_FAMILY,
            org_id=command.scope.org_id,
            app_installation_id=command.scope.app_installation_id,
            subject_kind="receipt",
            subject_id=command_id,
            definition_ref=command.runtime_name,
            catalog_revision=command.catalog_revision,
            catalog_digest=command.catalog_digest,
            # The exact request, so the sender needs no read; the row stays the record.
            payload=json.dumps({
                "command_id": command_id,
                "runtime": command.runtime_name,
                "request": commit_result_request(
                    scope=command.scope, intent_id=command.intent_id, command_id=command_id,
                    payload_digest=command.payload_digest,
                    catalog_revision=command.catalog_revision,
                    result_format_version=result_format_version, remote_id=remote_id,
                    canonical_result=canonical_result, result_digest=result_digest),
            }),
            max_attempts=receipt_max_attempts,
            dedupe_key=f"receipt:{command_id}",
        )],
        now_us,
    )
    return work.work_id


# The checkpoint of a call that is not a command's (a subscription step: ``command_id`` is
# the step's WorkItem id), with its pins in the statement itself: the durable binding is
# still connected at the generation the step pinned, and no earlier attempt of the step
# is unresolved. Inserted only if both hold (judged by the affected rows).
_INSERT_PINNED_ATTEMPT_SQL = (
    f"INSERT INTO effect_attempts ({_ATTEMPT_COLUMNS}, lease_token, row_version)"
    " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL, NULL, NULL, ?, ?, 0 FROM {source} WHERE {pin}NOT EXISTS (SELECT 1"
    " FROM effect_attempts a WHERE a.command_id = ? AND a.disposition IS NULL"
    " AND (a.outcome IS NULL OR a.outcome = 'OUTCOME_UNKNOWN'))"
)
_BINDING_PIN = ("principal_bindings b",
                "b.binding_id = ? AND b.generation = ? AND b.state = 'connected' AND ")
# ... and no kin item's either (issue 22).
_KIN_CLAUSE = f" AND NOT EXISTS (SELECT 1{_KIN_UNRESOLVED} AND w.subject_id = ?)"
# A call whose credential is not the binding's (a subscription's own cleanup token).
_NO_BINDING_PIN = ("(SELECT 1 AS one) t", "")


async def insert_attempt_pinned(tx: SqlTx, attempt_id: str, fence: Fence, draft: AttemptDraft,
                                now_us: int, *, binding_id: str,
                                binding_generation: int | None, kin: Kin | None = None
                                ) -> bool:
    """Inside the caller's fenced transaction: the dispatch-start checkpoint, written only
    if the binding is connected at ``binding_generation`` (None: the call carries no
    binding credential), the same ``command_id`` has no unresolved attempt, and (``kin``)
    no item of its kin has one either. False: nothing was written (a pin no longer
    holds)."""
    source, pin = _NO_BINDING_PIN if binding_generation is None else _BINDING_PIN
    pins: tuple[Any, ...] = (() if binding_generation is None
                             else (binding_id, binding_generation))
    kinship = (_KIN_CLAUSE, (*_kin_params(kin), kin.subject_id)) if kin else ("", ())
    inserted = await tx.execute(
        _INSERT_PINNED_ATTEMPT_SQL.format(source=source, pin=pin) + kinship[0],
        (*_attempt_params(attempt_id, fence, draft, now_us), *pins, draft.command_id,
         *kinship[1]))
    return bool(inserted)
