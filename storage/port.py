"""The storage contract.

Theory of operation
-------------------
Two layers meet here.

* :class:`Database` is what an *adapter* provides (``storage/sqlite``,
  ``storage/mysql``): run one transaction body with bounded whole-transaction
  retry on the backend's deadlock/conflict/busy codes, and say clearly when a
  COMMIT's outcome is unknown. Statements are written once, with ``?``
  placeholders and only the portable SQL of ``docs/architecture.md``.
* :class:`WorkStorePort` is what the *kernel* uses: noun + verb methods, one
  params value, an injectable ``now_us``; every write after a claim is
  guarded by the fence (``..._if_owner``). It is implemented once over any
  :class:`Database` (``storage/work_store.py``), and one conformance suite
  (``tests/storage``) runs it against every adapter.

Errors are typed so callers branch on meaning, not on driver codes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs

from daemon.core.capability import DEFAULT_PAYLOAD_SCHEMA_VERSION, ENGINE_CAPABILITY_VERSION
from daemon.core.outcomes import Finalization
from daemon.core.states import WorkState
from daemon.core.work import Fence, WorkItem, WorkSpec

T = TypeVar("T")
Row = tuple[Any, ...]


class StorageError(Exception):
    """Base of every storage error; its message never carries row payloads."""


class DatabaseUnavailable(StorageError):
    """The database could not be reached (refused, timed out, lost before COMMIT)."""


class DatabaseRejected(StorageError):
    """The server answered but refused us for good (wrong password, unknown database):
    a configuration problem that waiting will not fix."""


class RetryableConflict(StorageError):
    """Deadlock, lock-wait timeout, write conflict or SQLite BUSY: retry the whole transaction."""


class RetriesExhausted(StorageError):
    """A transaction kept meeting retryable conflicts past its retry budget."""


class CommitOutcomeUnknown(StorageError):
    """The connection was lost during COMMIT: reconcile by reading, never blind-retry."""


class StatementTooLarge(StorageError):
    """A statement (one row, or the smallest batch of rows) is larger than the database
    takes in one statement (MariaDB/MySQL ``max_allowed_packet``, read at connect): it was
    not sent, and sending it again will not help. The connection and the transaction are
    still usable; a caller with a batch splits it, a single row is refused for good."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class StorageRefused(StorageError):
    """The server refused a statement for what it holds (a value too long for its column,
    a string it cannot store...): sending it again fails the same way. ``code``: the
    server's error number; the message never carries the values."""

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


def deterministic(exc: StorageError) -> bool:
    """Whether this error is the statement's own (it fails again as sent: split a batch to
    find the row, refuse that row) rather than the database's state (unreachable, an
    unknown COMMIT, contention: waiting helps, and a batch is tried again whole)."""
    return isinstance(exc, StatementTooLarge | StorageRefused)


class DuplicateKey(StorageError):
    """A unique key already holds this value."""


class SchemaMismatch(StorageError):
    """The database schema is not the version this build expects."""


class LostLease(StorageError):
    """A fenced write found that the caller no longer owns the WorkItem."""

    def __init__(self, fence: Fence) -> None:
        super().__init__(
            f"lost lease on work {fence.work_id} (epoch {fence.ownership_epoch})"
        )
        self.fence = fence


class WorkNotFound(StorageError):
    def __init__(self, work_id: str) -> None:
        super().__init__(f"no work item {work_id}")
        self.work_id = work_id


class WorkConflict(StorageError):
    """A requested operator transition lost to another transition or is not legal now."""


class RevisionNotPublished(StorageError):
    """A Catalog revision named by a caller is not published."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"catalog revision {revision} is not published")
        self.revision = revision


class RevisionConflict(WorkConflict):
    """A publish or delete of a Catalog revision that its stored facts forbid."""


class SqlTx(Protocol):
    """One open transaction. Statements use ``?`` placeholders."""

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the matched row count."""
        ...

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run one INSERT for many rows (a multi-row INSERT where the driver can).

        All or nothing: after an error (a duplicate key, say) no row was written.
        """
        ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        ...


@attrs.define
class DbStats:
    """Counters every adapter keeps: the benchmark's statements and commits per item."""

    statements: int = 0
    # Writing transactions committed (reads are not counted: they cost no fsync).
    commits: int = 0
    rollbacks: int = 0
    retries: int = 0
    unknown_commits: int = 0
    # Per transaction name: (count, total seconds). Names are fixed strings
    # ("work.claim", "effect.checkpoint"...), so this stays small.
    durations: dict[str, list[float]] = attrs.field(factory=dict)
    # Time spent waiting for a pooled connection (MySQL) or the process's
    # connection lock (SQLite).
    wait_seconds: float = 0.0

    def observe(self, name: str, seconds: float) -> None:
        entry = self.durations.setdefault(name, [0.0, 0.0])
        entry[0] += 1
        entry[1] += seconds


class Database(Protocol):
    """What a storage adapter provides."""

    @property
    def backend(self) -> str:
        """``sqlite`` or ``mysql`` (metrics label)."""
        ...

    @property
    def stats(self) -> DbStats: ...

    @property
    def max_statement_bytes(self) -> int:
        """The largest statement the server takes (MariaDB/MySQL: ``max_allowed_packet``
        as read at the latest connect, less the protocol's own bytes): batched writes
        are cut to fit it, and a row larger than it raises :class:`StatementTooLarge`."""
        ...

    async def transact(
        self, body: Callable[[SqlTx], Awaitable[T]], *, name: str, write: bool = True
    ) -> T:
        """Run ``body`` in one transaction, retrying the whole body on retryable conflicts.

        Raises :class:`CommitOutcomeUnknown` when the COMMIT's fate is unknown,
        :class:`DatabaseUnavailable` when the server cannot be reached, and
        :class:`RetriesExhausted` when conflicts outlast the retry budget.
        """
        ...

    async def ping(self) -> None:
        """Round-trip to the database or raise :class:`DatabaseUnavailable`."""
        ...

    async def aclose(self) -> None:
        ...


# ---------------------------------------------------------------- params & results


@attrs.frozen(kw_only=True)
class ClaimParams:
    family: str
    owner: str
    limit: int
    lease_ttl_us: int
    # Oldest-first candidates examined to shape a fair batch.
    window: int = 0
    # Also sweep rows whose lease expired (reclaim, or dead when attempts are spent).
    include_expired: bool = False
    rotation: int = 0
    # Batch-sized slots of the ready set (oldest first) the claim may start in, chosen
    # by ``rotation``: claimants in different slots read different rows, so they do
    # not race for them (daemon/core/claim_spread.py). One: the oldest window.
    spread: int = 1
    # Rows per slot: the family's batch size, the same for every claimant whatever its
    # ``limit`` (a claim for a few free slots takes the head of its slot). 0: the limit.
    stride: int = 0
    # Claim from the claimant's own part of the ready set only (daemon/core/claim_spread.py
    # ``claim_part``, by ``rank`` among ``claimants``) and what the next rank's part holds
    # beyond its oldest batch: a short or empty claim when those run dry, whatever else
    # is ready (the next claim, not parted, takes that by slot). No effect alone.
    parted: bool = False
    # The claimant's rank among the live claimants of the family and how many they are
    # (the heartbeats; advice only, daemon/core/claim_spread.py ``claim_slot``):
    # claimants that read at the same moment start in different slots.
    rank: int = 0
    claimants: int = 1
    # Orgs whose oldest ready work joins the candidates even when another
    # org's backlog fills the oldest-first window (fair share across orgs).
    orgs: tuple[str, ...] = ()
    # Read candidates before opening a write transaction, so that an idle poll
    # costs no write. A busy claimer turns it off: selecting and updating in one
    # short transaction leaves other replicas less time to take the same rows.
    probe_first: bool = True
    # The newest engine capability and payload schema the claimant can run: work
    # written for newer ones is left (pending, or its expired lease unreclaimed)
    # for a replica that can (daemon/core/capability.py).
    engine_capability_version: int = ENGINE_CAPABILITY_VERSION
    payload_schema_version: int = DEFAULT_PAYLOAD_SCHEMA_VERSION


@attrs.frozen
class Reclaim:
    """An expired lease this claim superseded (journaled as a ``lease_lost`` execution)."""

    work_id: str
    superseded_epoch: int
    attempt: int
    previous_owner: str
    # The attempts were spent: the item went to dead instead of to this claimant.
    dead: bool


@attrs.frozen
class ClaimResult:
    claimed: list[WorkItem]
    # Expired rows whose attempts were spent, moved to dead by this claim.
    expired_dead: list[str]
    # Candidates another claimant won first (contention, for metrics).
    contended: int
    # Expired leases this claim superseded (reclaimed, or moved to dead).
    reclaimed: list[Reclaim] = attrs.field(factory=list)


@attrs.frozen
class RenewResult:
    renewed: dict[str, int]  # work id -> new lease_until_us
    lost: list[Fence]
    cancel_requested: list[Fence]


@attrs.frozen
class RenewGroup:
    """Fences renewed for one lease TTL (one family's flights)."""

    fences: tuple[Fence, ...]
    lease_ttl_us: int


@attrs.frozen
class FinalizeResult:
    fence: Fence
    applied: bool
    state: WorkState | None
    # A side write that failed (the finalization was rolled back with it).
    error: str | None = None


@attrs.frozen
class EnqueueResult:
    work_id: str
    created: bool  # False: an existing item had the same dedupe key


@attrs.frozen(kw_only=True)
class WorkQuery:
    state: WorkState | None = None
    family: str | None = None
    org_id: str | None = None
    subject_id: str | None = None
    lane: str | None = None
    after_id: str | None = None  # keyset pagination, newest first
    limit: int = 50
    # Created at or after / before (ULID bounds of the creation time; see
    # daemon.core.find_query.id_floor).
    since_id: str | None = None
    until_id: str | None = None


@attrs.frozen
class QueueDepth:
    family: str
    state: WorkState
    count: int
    oldest_run_after_us: int | None
    # The count stopped at the sampler's cap (storage.work_admin.DEPTH_COUNT_CAP): there
    # are at least ``count`` items (a bounded count, never a scan of a deep queue).
    capped: bool = False


@attrs.frozen
class OutcomeCount:
    family: str
    outcome: str  # the state a finalization produced: succeeded, retry, dead, ...
    count: int


@attrs.frozen(kw_only=True)
class ReplayParams:
    work_id: str
    actor: str
    role: str
    reason: str
    # The current Catalog (revision, digest) the caller resolved; the audit
    # entry records it beside the replayed item's pinned one.
    resolved_catalog: tuple[int, str] | None = None


@attrs.frozen(kw_only=True)
class AuditEntry:
    audit_id: str
    at_us: int
    actor: str
    role: str
    action: str
    target_kind: str
    target_id: str
    reason: str
    before: str
    after: str
    # Where the action came from, as JSON text (the CLI records the OS user and
    # SUDO_USER beside the --actor it was given); None when not recorded.
    origin: str | None = None


@attrs.frozen
class CancelResult:
    work_id: str
    # "cancelled" (was unclaimed), "requested" (claimant will acknowledge), "noop" (terminal)
    disposition: str
    state: WorkState


@attrs.frozen
class Execution:
    """One execution of a WorkItem (one ownership epoch): who ran it and how it ended.

    ``outcome`` is the state its finalization produced, ``lease_lost`` when the
    lease expired unfinished and ``reclaimed_by`` superseded it (``finished_at_us``
    is then the moment of the reclaim), or ``deferred`` when the claim was given
    back unstarted until a known time (its attempt refunded). ``reason`` is the
    deferral's reason or the finalization's failure class.
    """

    work_id: str
    ownership_epoch: int
    attempt: int
    replica: str
    outcome: str
    finished_at_us: int
    reclaimed_by: str | None = None
    reason: str | None = None


@attrs.frozen
class ExecutionSummary:
    """Executions of one family in the journal (every outcome, ``lease_lost`` included)."""

    executions: int
    items: int  # distinct work ids with at least one execution
    succeeded_items: int  # distinct work ids with a succeeded execution
    by_outcome: dict[str, int]

    @property
    def repeated(self) -> int:
        """Executions beyond the first of each item (the benchmarks' "duplicates")."""
        return self.executions - self.items


@attrs.frozen(kw_only=True)
class ReplicaInfo:
    replica_id: str
    hostname: str
    pid: int
    version: str
    state: str  # starting | running | draining | stopped
    families: str
    started_at_us: int
    heartbeat_at_us: int


class WorkStorePort(Protocol):
    """The kernel's storage contract (see the module docstring)."""

    db: Database

    async def work_enqueue(
        self, specs: Sequence[WorkSpec], now_us: int
    ) -> list[EnqueueResult]: ...

    async def work_claim(self, params: ClaimParams, now_us: int) -> ClaimResult: ...

    # A fenced write takes the clock (``now``), not a reading: it is read inside the
    # transaction, so the fence is judged when the statements run, not at a time read
    # before a wait for a connection or a freeze.
    async def work_renew_if_owner(
        self, fences: Sequence[Fence], lease_ttl_us: int, now: Callable[[], int]
    ) -> RenewResult: ...

    async def work_renew_groups(
        self, groups: Sequence[RenewGroup], now: Callable[[], int]
    ) -> RenewResult: ...

    async def work_finalize_if_owner(
        self, finalizations: Sequence[Finalization], replica: str, now: Callable[[], int]
    ) -> list[FinalizeResult]: ...

    async def work_fenced(
        self, fence: Fence, now: Callable[[], int], body: Callable[[SqlTx], Awaitable[T]], *,
        name: str
    ) -> T: ...

    async def work_get(self, work_id: str) -> WorkItem | None: ...

    async def work_list(self, query: WorkQuery) -> list[WorkItem]: ...

    async def work_cancel(self, work_id: str, now_us: int) -> CancelResult: ...

    async def work_replay(self, params: ReplayParams, now_us: int) -> WorkItem: ...

    async def work_depths(self) -> list[QueueDepth]: ...

    async def work_executions(self, work_id: str) -> list[Execution]: ...


# ------------------------------------------------- operator console (admin UI)


@attrs.frozen(kw_only=True)
class CancelParams:
    """An operator's cancel: who, in which role, and why (kept in the audit log)."""

    work_id: str
    actor: str
    role: str
    reason: str


@attrs.frozen(kw_only=True)
class DeadQuery:
    """Dead items (the DLQ), newest first, by family and failure class, keyset-paginated."""

    family: str | None = None
    failure_class: str | None = None
    # Leave out dead items that were already replayed (a replay has ``replay_of`` = them).
    unreplayed_only: bool = False
    after_id: str | None = None
    limit: int = 50


@attrs.frozen
class DeadClassCount:
    """How many of the sampled dead items have one (family, failure class)."""

    family: str
    failure_class: str | None
    count: int


# ------------------------------------------------------- Catalog revisions


@attrs.frozen(kw_only=True)
class CatalogRevision:
    """One published Catalog revision: an immutable fact."""

    revision: int
    digest: str
    content: str = attrs.field(repr=False)  # canonical JSON; "" in listings
    published_by: str
    published_at_us: int


@attrs.frozen(kw_only=True)
class PublishParams:
    revision: int
    digest: str
    content: str = attrs.field(repr=False)
    actor: str
    role: str
    reason: str


# Pinned work is counted up to this many rows each (an index range that stops there):
# beyond it the listing says "more", never a count of the revision's whole history.
PIN_COUNT_LIMIT = 1000


@attrs.frozen
class RevisionPins:
    """Unsettled work pinned to one revision (a delete needs both at zero), each counted
    up to :data:`PIN_COUNT_LIMIT`; ``*_more``: there are more than the count says."""

    open_commands: int
    live_work: int
    open_commands_more: bool = False
    live_work_more: bool = False

    @property
    def pinned(self) -> bool:
        return bool(self.open_commands or self.live_work)


class CatalogRevisionPort(Protocol):
    """Publishing, reading and deleting Catalog revisions (``storage/catalog_revisions.py``)."""

    async def catalog_publish(self, params: PublishParams,
                              now_us: int) -> tuple[CatalogRevision, bool]: ...

    async def catalog_get(self, revision: int) -> CatalogRevision | None: ...

    async def catalog_digest(self, revision: int) -> str | None: ...

    async def catalog_list(self) -> list[CatalogRevision]: ...

    async def catalog_pins(self, revision: int) -> RevisionPins: ...

    async def catalog_delete(self, revision: int, *, actor: str, role: str, reason: str,
                             now_us: int) -> CatalogRevision: ...
