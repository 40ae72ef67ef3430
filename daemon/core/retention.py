"""Retention decisions (pure): what the pruner may delete, how much at once, who prunes.

Theory of operation
-------------------
Two horizons. The *work* horizon (``retention.work_days``) ends the life of terminal
WorkItems, their executions, resolved effect attempts and confirmed Runtime receipts. The
*facts* horizon (``retention.facts_days``, strictly longer) covers what the seeds require
to outlive the Runtime's outbox, redelivery and workflow windows (seed 6.1): handoff
admission facts (``COMMAND_ACCEPTED``) and rejection tombstones (``HANDOFF_REJECTED``),
and dedup facts (a terminal WorkItem that carries a ``dedupe_key``, or a rolled-back
``reconciled_legacy_terminal`` row, whose identity must keep refusing a second item).
The *ingress* horizon (``ingress.retention_days``) ends webhook receipts and their
normalized events, and with them exact dedup of a redelivery.

The *commands* horizon (``retention.commands_days``, at least the facts horizon) ends
settled ``external_commands``. A handoff key stays deduplicated by its admission fact
(``handoff_admissions``, the facts horizon): that is the window the Runtime may repeat a
key in, and a command is kept while its admission fact exists, so its
``handoff_key`` (unique) outlives the fact rather than the other way round. The
*quarantine* horizon (``retention.quarantine_days``) ends the evidence of conflicting
handoff repeats (``handoff_quarantine``).

A row is pruned only when every guard of its rule says so; a guard that lacks a fact
keeps the row (:class:`Keep`). The verdicts below take the facts the shell read and
answer :class:`Prune` or :class:`Keep` with a reason; they never see a connection.

One pruner at a time, cluster-wide: a lease row in the database (``retention_leases``)
names the holder, its token and an epoch. :func:`lease_decision` says whether this
replica may take it; every batch the holder deletes is fenced on that token in the same
transaction, so a pruner that lost its lease (paused, partitioned) deletes nothing.

Transaction size: a batch is at most ``batch_rows`` rows and at most ``batch_bytes``
of row data (TiDB refuses a transaction above 100 MB; :data:`TIDB_TXN_LIMIT_BYTES`),
the longest prefix of the candidates that fits (:func:`plan_batch`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

DAY_US = 86_400 * 1_000_000
TIDB_TXN_LIMIT_BYTES = 100 * 1024 * 1024
# A batch's byte budget may use at most a quarter of TiDB's limit: the deleted index
# entries and the lease update are counted by the engine too.
MAX_BATCH_BYTES = TIDB_TXN_LIMIT_BYTES // 4
# Fixed overhead per deleted row (keys, index entries) beside its measured text columns.
ROW_OVERHEAD_BYTES = 512


class Horizon(enum.StrEnum):
    WORK = "work"
    FACTS = "facts"
    INGRESS = "ingress"
    COMMANDS = "commands"
    QUARANTINE = "quarantine"


class RetentionConfigError(ValueError):
    """A retention setting that cannot work; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@attrs.frozen(kw_only=True)
class RetentionPolicy:
    work_days: float
    facts_days: float
    batch_rows: int
    batch_bytes: int
    ingress_days: float = 14.0  # ingress.retention_days
    commands_days: float = 400.0
    quarantine_days: float = 90.0

    def validate(self) -> RetentionPolicy:
        if not self.work_days > 0:
            raise RetentionConfigError("retention.work_days", "must be positive")
        if not self.ingress_days > 0:
            raise RetentionConfigError("ingress.retention_days", "must be positive")
        if not self.quarantine_days > 0:
            raise RetentionConfigError("retention.quarantine_days", "must be positive")
        if not self.facts_days > self.work_days:
            raise RetentionConfigError(
                "retention.facts_days",
                "must be longer than retention.work_days (admission facts, tombstones and"
                " dedup facts outlive the work they fenced)")
        if not self.commands_days >= self.facts_days:
            raise RetentionConfigError(
                "retention.commands_days",
                "must be at least retention.facts_days (the admission dedup window: a"
                " handed-off command's key must stay deduplicated as long as its admission"
                " fact)")
        if self.batch_rows < 1:
            raise RetentionConfigError("retention.batch_rows", "must be at least 1")
        if not 0 < self.batch_bytes <= MAX_BATCH_BYTES:
            raise RetentionConfigError(
                "retention.batch_bytes",
                f"must be between 1 and {MAX_BATCH_BYTES} (a quarter of TiDB's 100 MB"
                " transaction limit)")
        return self


@attrs.frozen
class Cutoffs:
    """Rows older than these (epoch us) are past their horizon."""

    work_us: int
    facts_us: int
    ingress_us: int = 0  # 0: no ingress receipt is old enough
    commands_us: int = 0  # 0: no command is old enough
    quarantine_us: int = 0  # 0: no quarantine record is old enough

    def of(self, horizon: Horizon) -> int:
        return {Horizon.WORK: self.work_us, Horizon.FACTS: self.facts_us,
                Horizon.INGRESS: self.ingress_us, Horizon.COMMANDS: self.commands_us,
                Horizon.QUARANTINE: self.quarantine_us}[horizon]


def cutoffs(policy: RetentionPolicy, now_us: int) -> Cutoffs:
    return Cutoffs(work_us=now_us - int(policy.work_days * DAY_US),
                   facts_us=now_us - int(policy.facts_days * DAY_US),
                   ingress_us=now_us - int(policy.ingress_days * DAY_US),
                   commands_us=now_us - int(policy.commands_days * DAY_US),
                   quarantine_us=now_us - int(policy.quarantine_days * DAY_US))


# ---------------------------------------------------------------- verdicts


@attrs.frozen
class Prune:
    pass


@attrs.frozen
class Keep:
    reason: str


PRUNE = Prune()
Verdict = Prune | Keep


@attrs.frozen(kw_only=True)
class TerminalItemFacts:
    """What the work-item guard needs about one terminal WorkItem."""

    updated_at_us: int
    has_dedupe_key: bool
    legacy_reconciled: bool  # state reconciled_legacy_terminal (a cutover identity)
    # This item is a replay of an item that still exists: pruning it would let the
    # original be replayed a second time (replay_of is unique).
    replay_original_exists: bool
    # For an item of a command: that command's settlement (None: no command, or the
    # item is not a command's), and whether an open repair of the command exists.
    command_settlement: str | None
    command_missing: bool = False
    open_repair: bool = False


def work_item_verdict(item: TerminalItemFacts, cut: Cutoffs) -> Verdict:
    identity = item.has_dedupe_key or item.legacy_reconciled
    horizon = cut.facts_us if identity else cut.work_us
    if item.updated_at_us >= horizon:
        return Keep("dedup_fact" if identity and item.updated_at_us < cut.work_us
                    else "within_retention")
    if item.replay_original_exists:
        return Keep("replay_lineage")
    if item.command_missing:
        return Keep("command_unreadable")
    if item.command_settlement == "open":
        return Keep("command_unsettled")
    if item.open_repair:
        return Keep("open_repair")
    return PRUNE


@attrs.frozen(kw_only=True)
class ExecutionFacts:
    finished_at_us: int
    work_live: bool  # its WorkItem exists and is not terminal


def execution_verdict(row: ExecutionFacts, cut: Cutoffs) -> Verdict:
    if row.finished_at_us >= cut.work_us:
        return Keep("within_retention")
    if row.work_live:
        return Keep("work_live")
    return PRUNE


@attrs.frozen(kw_only=True)
class AttemptFacts:
    finished_at_us: int | None
    outcome: str | None
    disposition: str | None
    command_settlement: str | None  # None: the command row is missing
    command_work_live: bool
    open_repair: bool


def attempt_verdict(row: AttemptFacts, cut: Cutoffs) -> Verdict:
    if row.finished_at_us is None or row.outcome is None:
        return Keep("no_outcome")
    if row.outcome == "OUTCOME_UNKNOWN" and row.disposition is None:
        return Keep("outcome_unknown")
    if row.finished_at_us >= cut.work_us:
        return Keep("within_retention")
    if row.command_settlement is None:
        return Keep("command_unreadable")
    if row.command_settlement == "open":
        return Keep("command_unsettled")
    if row.command_work_live:
        return Keep("work_live")
    if row.open_repair:
        return Keep("open_repair")
    return PRUNE


@attrs.frozen(kw_only=True)
class ReceiptFacts:
    state: str
    confirmed_at_us: int | None
    receipt_work_live: bool
    open_repair: bool
    # Its command is retired and still stored: the receipt (written by a repair's
    # result) is the only proof the command's Runtime intent was answered, so it stays
    # until the command goes (the command rule reads it).
    command_retired: bool = False


def receipt_verdict(row: ReceiptFacts, cut: Cutoffs) -> Verdict:
    if row.state != "confirmed" or row.confirmed_at_us is None:
        return Keep("unconfirmed")
    if row.confirmed_at_us >= cut.work_us:
        return Keep("within_retention")
    if row.receipt_work_live:
        return Keep("work_live")
    if row.open_repair:
        return Keep("open_repair")
    if row.command_retired:
        return Keep("retired_command_proof")
    return PRUNE


@attrs.frozen(kw_only=True)
class IngressReceiptFacts:
    state: str  # received | materialized | quarantined
    received_at_us: int
    work_live: bool  # some WorkItem of one of its events is not terminal


def ingress_receipt_verdict(row: IngressReceiptFacts, cut: Cutoffs) -> Verdict:
    if row.state == "received":
        return Keep("unsettled")  # the materializer has not read it yet
    if row.received_at_us >= cut.ingress_us:
        return Keep("within_retention")
    if row.work_live:
        return Keep("work_live")  # the raw delivery is the evidence of live work
    return PRUNE


@attrs.frozen(kw_only=True)
class AdmissionFacts:
    admission: str
    created_at_us: int
    # For COMMAND_ACCEPTED: the command's settlement (None: no such command row).
    command_settlement: str | None


def admission_verdict(row: AdmissionFacts, cut: Cutoffs) -> Verdict:
    if row.created_at_us >= cut.facts_us:
        return Keep("within_retention")
    if row.admission == "HANDOFF_REJECTED":
        return PRUNE
    if row.admission != "COMMAND_ACCEPTED":
        return Keep("unknown_admission")
    if row.command_settlement is None:
        return Keep("command_unreadable")
    if row.command_settlement == "open":
        return Keep("command_unsettled")
    return PRUNE


@attrs.frozen(kw_only=True)
class CommandFacts:
    """What the command guard needs about one ``external_commands`` row."""

    settlement: str
    settled_at_us: int  # updated_at_us: when it was settled
    handed_off: bool  # it has a handoff_key (a Runtime intent it owes a receipt)
    admission_exists: bool  # the admission fact of its handoff_key is still stored
    # Its Runtime receipt row (keyed by its id): None when there is none (never written,
    # or confirmed and pruned: retention deletes only confirmed receipts).
    receipt_state: str | None
    work_exists: bool  # a WorkItem of it (its dispatch or its receipt), in any state
    attempts_exist: bool  # an effect attempt of it
    open_repair: bool  # an open repair command of it
    repair_original_exists: bool  # it is a repair and the command it repairs still exists
    # An older command of the same binding and local record is still stored and may
    # still be replayed or repaired (open or retired, or with a WorkItem): this one's
    # success is what refuses that from overwriting it (an older intent never does).
    older_on_record: bool


# Settlements that wrote the Runtime receipt of a handed-off command in the same
# transaction (storage.effects.settle): a missing receipt row was confirmed and pruned.
_RECEIPT_WRITTEN = frozenset({"succeeded", "no_effect"})


def command_verdict(row: CommandFacts, cut: Cutoffs) -> Verdict:
    if row.settlement == "open":
        return Keep("command_unsettled")
    if row.settled_at_us >= cut.commands_us:
        return Keep("within_retention")
    if row.admission_exists:
        return Keep("admission_fact")  # the dedup fact goes first (the facts horizon)
    if row.work_exists:
        return Keep("work_exists")
    if row.attempts_exist:
        return Keep("attempts_exist")
    if row.open_repair:
        return Keep("open_repair")
    if row.repair_original_exists:
        return Keep("repair_lineage")  # one repair per original: the original goes first
    if row.handed_off:
        if row.receipt_state is not None and row.receipt_state != "confirmed":
            return Keep("receipt_unconfirmed")
        if row.receipt_state is None and row.settlement not in _RECEIPT_WRITTEN:
            # Retired without a receipt: the Runtime intent still blocks (a repair may
            # still answer it); nothing proves it was ever answered.
            return Keep("receipt_owed")
    if row.older_on_record:
        return Keep("older_intent_on_record")
    return PRUNE


@attrs.frozen(kw_only=True)
class QuarantineFacts:
    at_us: int


def quarantine_verdict(row: QuarantineFacts, cut: Cutoffs) -> Verdict:
    """Evidence of a conflicting handoff repeat: kept for its own horizon, nothing else
    refers to it (the admission fact, not the quarantine, is what deduplicates)."""
    if row.at_us >= cut.quarantine_us:
        return Keep("within_retention")
    return PRUNE


# ---------------------------------------------------------------- batches


@attrs.frozen
class BatchPlan:
    walked: int  # candidates this batch settles (pruned or kept); the cursor ends there
    prune: tuple[int, ...]  # indexes of the candidates to delete


def plan_batch(judged: Sequence[tuple[Verdict, int]], *, max_bytes: int) -> BatchPlan:
    """Walk the judged candidates (verdict, text bytes) in scan order: delete the
    prunable ones until the next would pass ``max_bytes``, and stop there (the rest are
    the next batch's). A single oversized row is still deleted alone: never a batch that
    cannot move."""
    spent = 0
    prune: list[int] = []
    walked = 0
    for index, (verdict, size) in enumerate(judged):
        if isinstance(verdict, Prune):
            cost = max(0, size) + ROW_OVERHEAD_BYTES
            if prune and spent + cost > max_bytes:
                break
            spent += cost
            prune.append(index)
        walked += 1
    return BatchPlan(walked, tuple(prune))


def overdue_us(oldest_age_us: int | None, cutoff_us: int) -> int:
    """The lag: how far past its horizon the oldest prunable row is (0 if none)."""
    if oldest_age_us is None:
        return 0
    return max(0, cutoff_us - oldest_age_us)


def sweep_due(last_sweep_us: int, now_us: int, sweep_interval_us: int) -> bool:
    """Restart every rule's scan from its beginning (rows a guard kept earlier, such as
    an item whose command has settled since, are found again)."""
    return last_sweep_us <= 0 or now_us - last_sweep_us >= sweep_interval_us


# ---------------------------------------------------------------- the lease


@attrs.frozen
class LeaseView:
    holder: str | None
    token: str | None
    until_us: int
    epoch: int


@attrs.frozen
class TakeLease:
    expected_epoch: int  # the CAS: the row must still be at this epoch


@attrs.frozen
class CreateLease:
    pass


@attrs.frozen
class LeaseHeld:
    holder: str
    until_us: int


LeaseDecision = TakeLease | CreateLease | LeaseHeld


def lease_decision(row: LeaseView | None, now_us: int) -> LeaseDecision:
    """May a pruner take the lease now? Only when nobody holds it or it has expired."""
    if row is None:
        return CreateLease()
    if row.token is not None and row.until_us >= now_us:
        return LeaseHeld(row.holder or "", row.until_us)
    return TakeLease(row.epoch)
