"""Effect outcomes: classification and reconciliation, as pure functions.

Theory of operation
-------------------
Every external call is one :class:`DispatchObservation`: how far the
exchange got (never connected, request bytes may have left, a response
arrived) and, if a response arrived, its status and ``Retry-After``. The
frozen :class:`OperationContract` (from the L1 definition) declares the
operation's status semantics: which statuses mean "accepted", "not applied"
and "rejected" (three disjoint sets, each declared: L0 assumes no meaning for
any status, a 429 included), and how a replay is proven safe (a
:class:`ReplayProof`: the idempotency header the provider honours, and for how
long), if it is.
:func:`classify` maps the two to exactly one outcome class:

==========================  ============================================
``ACCEPTED``                an accepted status naming the pinned record
                            (where the definition says responses name one)
``REJECTED``                a declared rejected status (by default a 4xx)
``RETRYABLE_PRE_DISPATCH``  proven to fail before any byte left (or held
                            back by our own quota or send gate: not a
                            failure, and no attempt is charged for it)
``REPLAY_SAFE_RETRY``       a declared not-applied status (e.g. 429), or a
                            maybe-applied exchange whose request carried the
                            idempotency header the contract's proof names
``OUTCOME_UNKNOWN``         bytes may have left and nothing proves the
                            outcome (including a 2xx that names another
                            record, or none): reconcile or ask an operator
==========================  ============================================

Each classification also carries its *evidence* about the effect itself,
kept apart from the class because one class can hold both: a
``REPLAY_SAFE_RETRY`` after a 429 is proven **not applied**, one after a
timeout or a 5xx of a replay-safe operation is only **maybe applied** (the
contract says a replay is safe, not that nothing happened). Only evidence
``NOT_SENT`` or ``NOT_APPLIED`` can ever count towards a ``NO_EFFECT`` result
(:mod:`daemon.core.no_effect`).

There is no hidden retry anywhere: the durable scheduler decides what
happens next from the class, and an ``OUTCOME_UNKNOWN`` is never turned into
a new call until :func:`reconcile` proves the effect absent (or present).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from daemon.core.exchange_excerpt import ExchangeExcerpt


class OutcomeClass(enum.StrEnum):
    ACCEPTED = "ACCEPTED"
    REJECTED = "REJECTED"
    RETRYABLE_PRE_DISPATCH = "RETRYABLE_PRE_DISPATCH"
    REPLAY_SAFE_RETRY = "REPLAY_SAFE_RETRY"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"


class Evidence(enum.StrEnum):
    """What one exchange proves about the effect, whatever its class."""

    NOT_SENT = "not_sent"  # no byte left: the provider never saw the request
    NOT_APPLIED = "not_applied"  # the provider answered that it did not apply it
    MAYBE_APPLIED = "maybe_applied"  # bytes left and nothing proves either way
    APPLIED = "applied"  # the provider answered that it applied it


class Phase(enum.StrEnum):
    # Our own side held the request back before any byte left: its quota send slot
    # expired while it waited (for a free connection, the checkpoint, the event loop),
    # or no free connection of ours came within the timeout. Nothing was sent and
    # nothing failed: contention, never a failed attempt (see HELD_CLASSES).
    HELD = "held"
    NOT_CONNECTED = "not_connected"  # connect refused/timed out: nothing sent
    SENT = "sent"  # bytes may have left; no (complete) response
    RESPONDED = "responded"


# The details a HELD observation carries, and the failure class each is shown with.
SLOT_EXPIRED = "quota_slot_expired"  # a quota send slot's window passed unused
CONNECTION_WAIT = "connection_wait"  # no free connection of ours within the timeout
HELD_CLASSES: Mapping[str, str] = {SLOT_EXPIRED: "quota_slot_expired",
                                   CONNECTION_WAIT: "quota_connection_wait"}


@attrs.frozen
class IdentityEvidence:
    """Which record a response says it changed, beside the one the command pinned."""

    expected: str
    # None when the response does not name a record where the definition says it does.
    named: str | None

    @property
    def problem(self) -> str:
        """Empty when the response names the pinned record; else a stable failure class."""
        if self.named is None:
            return "identity_missing"
        return "" if self.named == self.expected else "identity_mismatch"


@attrs.frozen
class DispatchObservation:
    phase: Phase
    status: int | None = None
    retry_after_s: float | None = None
    # A short, safe description for operators (exception type, never a body).
    detail: str = ""
    # Where the L1 definition says a response names its record: what this one named.
    # None when the definition does not say (nothing to check).
    identity: IdentityEvidence | None = None
    # The provider's own quota headers L1's dimensions name (remaining counts, resets),
    # as (lower-case name, value) pairs.
    quota_headers: tuple[tuple[str, str], ...] = ()
    # The header the request carried the command's idempotency key in ("": none).
    idempotency_header: str = ""
    # A failed call's exchange (what was sent, what came back), redacted and bounded;
    # None for a success or a call that never left.
    exchange: ExchangeExcerpt | None = None


# The provider's in-flight window an operation gets when L1 does not declare one.
DEFAULT_MAX_IN_FLIGHT_S = 30.0


@attrs.frozen(kw_only=True)
class ReplayProof:
    """How the provider proves that a repeat of a call cannot repeat its effect (seed 6:
    a replay-safe retry is a declared proof, not a flag). The request carries the
    command's idempotency key in ``header``, and the provider honours it for
    ``retention_s``: a repeat with the same key within that time applies nothing again.
    L0 checks both: a request that did not carry the header proves nothing
    (:func:`classify`), and a replay later than the retention after the first maybe
    applied dispatch is no longer proven safe (it is reconciled instead:
    :mod:`daemon.core.effect_step`)."""

    header: str = attrs.field(validator=attrs.validators.min_len(1))
    retention_s: float = attrs.field(validator=attrs.validators.gt(0))

    def carried_by(self, seen: DispatchObservation) -> bool:
        return seen.idempotency_header.lower() == self.header.lower()


@attrs.frozen(kw_only=True)
class OperationContract:
    """What the frozen L1 operation definition promises about one call.

    Each status's meaning is the operation's own declaration (three disjoint sets;
    the L1 loader requires all three and refuses a status in two of them): L0
    assumes nothing, not even that a 429 was not applied. A response status in none of
    them is "maybe applied" (a 5xx, say): reconciled, or retried when replay is proven
    safe."""

    # Statuses that mean the call was applied (subject to the identity check).
    accepted_statuses: frozenset[int]
    # Statuses the provider documents as "not applied" (safe to try again).
    not_applied_statuses: frozenset[int]
    # Statuses that mean the provider refused the call for good, and applied nothing.
    rejected_statuses: frozenset[int]
    # The declared proof that a repeated call cannot repeat the effect (None: none).
    replay: ReplayProof | None = None
    default_retry_after_s: float = 5.0
    # The provider processes or drops a request within this window.
    max_in_flight_s: float = DEFAULT_MAX_IN_FLIGHT_S
    # The largest clock difference the provider's last-modified times may have
    # against ours (a read-back's proof of absence subtracts it).
    max_clock_skew_s: float = 2.0


@attrs.frozen
class Classification:
    outcome: OutcomeClass
    evidence: Evidence
    retry_after_s: float | None = None
    failure_class: str = ""
    # Our own side held the request back (Phase.HELD): nothing left and nothing failed,
    # so the claim is given back charging no attempt (daemon.core.effect_step).
    held: bool = False


def classify(contract: OperationContract, seen: DispatchObservation) -> Classification:
    """Exactly one outcome class, and the evidence, for one observed exchange."""
    if seen.phase is Phase.HELD:
        return Classification(OutcomeClass.RETRYABLE_PRE_DISPATCH, Evidence.NOT_SENT, None,
                              HELD_CLASSES.get(seen.detail, "quota_held"), held=True)
    if seen.phase is Phase.NOT_CONNECTED:
        return Classification(OutcomeClass.RETRYABLE_PRE_DISPATCH, Evidence.NOT_SENT, None,
                              "connect")
    # Replay is proven safe only by the declared mechanism, carried by this very request.
    replay_safe = contract.replay is not None and contract.replay.carried_by(seen)
    if seen.phase is Phase.SENT:
        if replay_safe:
            return Classification(OutcomeClass.REPLAY_SAFE_RETRY, Evidence.MAYBE_APPLIED, None,
                                  "transport")
        return Classification(OutcomeClass.OUTCOME_UNKNOWN, Evidence.MAYBE_APPLIED, None,
                              "transport")
    status = seen.status
    if status is None:
        raise ValueError("a response observation needs a status")
    if status in contract.accepted_statuses:
        problem = seen.identity.problem if seen.identity is not None else ""
        if problem:
            # A 2xx about another record (or about none) does not prove *our* effect,
            # and does not prove its absence either: reconcile by reading back,
            # whatever the contract says about replays.
            return Classification(OutcomeClass.OUTCOME_UNKNOWN, Evidence.MAYBE_APPLIED, None,
                                  problem)
        return Classification(OutcomeClass.ACCEPTED, Evidence.APPLIED)
    if status in contract.not_applied_statuses:
        delay = seen.retry_after_s
        if delay is None:
            delay = contract.default_retry_after_s
        return Classification(OutcomeClass.REPLAY_SAFE_RETRY, Evidence.NOT_APPLIED, delay,
                              f"http_{status}")
    if status in contract.rejected_statuses:
        return Classification(OutcomeClass.REJECTED, Evidence.NOT_APPLIED, None,
                              f"http_{status}")
    # A status the operation does not declare (5xx, say) after sending: the provider
    # may have applied it.
    if replay_safe:
        return Classification(OutcomeClass.REPLAY_SAFE_RETRY, Evidence.MAYBE_APPLIED, None,
                              f"http_{status}")
    return Classification(OutcomeClass.OUTCOME_UNKNOWN, Evidence.MAYBE_APPLIED, None,
                          f"http_{status}")


class Reconciled(enum.StrEnum):
    APPLIED = "proven_applied"
    ABSENT = "proven_absent"
    UNPROVEN = "unproven"


@attrs.frozen
class RemoteSnapshot:
    """What a read-back of the remote record showed."""

    exists: bool
    properties: Mapping[str, str | None] = attrs.field(factory=dict)
    # The provider's last-modified time (epoch microseconds), if it exposes one.
    updated_at_us: int | None = None


@attrs.frozen
class Reconciliation:
    verdict: Reconciled
    # When nothing is proven *yet*, how long until a read-back could prove absence.
    retry_after_s: float | None = None


def reconcile(
    desired: Mapping[str, str | None],
    snapshot: RemoteSnapshot,
    *,
    earliest_dispatch_us: int,
    latest_dispatch_us: int,
    now_us: int,
    clock_skew_us: int,
    max_in_flight_us: int,
    unchanged_since_us: int | None = None,
) -> Reconciliation:
    """Decide what a read-back proves about unresolved dispatches.

    * The record shows every desired value: the effect is present (whoever
      wrote it, the end state the command asked for holds).
    * Absence needs two things: the provider's documented in-flight window
      has passed since the *latest* unresolved dispatch (a request still in
      flight could be applied after our read), and the record was not
      modified since the *earliest* one could have reached the provider. That
      is shown either by time (last modified before that dispatch, minus the
      allowed clock skew) or by identity: ``unchanged_since_us`` is the
      provider's own last-modified time of the record as our latest accepted
      change left it, known before the earliest unresolved dispatch (the
      change's answer named it). A provider that gives every change a later
      time (L1 declares it by ``response.updated_at``) shows exactly that
      time only if nothing changed the record since, our dispatches included.
      This is what proves a lost PATCH that followed our own change within the
      skew margin, where the time rule never can.
    * Otherwise nothing is proven; within the in-flight window, ask again
      once it has passed; after it, an operator decides.
    """
    if snapshot.exists and all(snapshot.properties.get(k) == v for k, v in desired.items()):
        return Reconciliation(Reconciled.APPLIED)
    settle_at = latest_dispatch_us + max_in_flight_us
    if now_us < settle_at:
        return Reconciliation(Reconciled.UNPROVEN, (settle_at - now_us) / 1_000_000)
    if snapshot.exists and snapshot.updated_at_us is not None and (
        snapshot.updated_at_us < earliest_dispatch_us - clock_skew_us
        or snapshot.updated_at_us == unchanged_since_us
    ):
        return Reconciliation(Reconciled.ABSENT)
    return Reconciliation(Reconciled.UNPROVEN)
