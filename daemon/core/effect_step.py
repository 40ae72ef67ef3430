"""One claim of one ExternalCommand: what to do next, as one pure decision.

Theory of operation
-------------------
The effect runner (the shell) reads a :class:`ClaimView` once: the command
with its pins, the operation definition the command pinned, the binding and
the remote link as they are now, every attempt, the request the executor
prepared, and (when the shell performed one for this claim) a read-back.
:func:`decide` returns the one :data:`Step` to perform; :func:`after_attempt`
does the same for the classification of the exchange just made. The shell
performs the step and nothing else. The rules, in the order they apply:

1. No command: blocked (``missing_command``). A settled command: nothing to do.
2. The command's targets are checked against what is current (seed 8.1, 13):
   it must carry pins (``unpinned_command``: admitted before pinning
   existed), the binding must still exist (``binding_missing``) and pin a
   durable generation (``unpinned_binding``), be connected
   (``binding_disconnected``) and at the pinned generation
   (``binding_generation``), a link must have existed at admission
   (``no_remote_link``) and must still be active (``link_inactive``) with the
   pinned generation (``link_generation``) and remote id
   (``remote_id_changed``). A failed check is a refusal *before any call*,
   for dispatch and read-back alike: nothing is ever sent with a new identity.
3. An unresolved attempt (unknown outcome, or no outcome after the
   checkpoint, or a maybe-applied replay-safe retry whose replay is no longer
   proven: the provider's retention of its idempotency key has passed):
   **reconcile**. With a failed target check, read-back is
   refused too and an operator decides (blocked). Otherwise the shell reads
   the record back and asks again: the desired values are there: settle
   success; proven absent: record it, then decide again; unproven: wait.
   Absence is proven only from the *later* of each dispatch and the moment
   the client gave up on the exchange, plus the in-flight window.
4. An accepted (or proven applied) attempt: settle success with the pinned
   remote id.
5. Refusals before dispatch (failed target check, operation gone, intent kind
   not admitted, request that does not fit the definition): settle
   ``NO_EFFECT`` when :func:`daemon.core.no_effect.no_effect_proof` proves
   it, otherwise blocked for an operator. Never a conversion of ambiguity.
6. No credentials: wait. Otherwise: **dispatch** the prepared request.
7. After the exchange (:func:`after_attempt`): a request our own quota or send gate
   held back (nothing left, nothing failed) is given back unstarted, charging no
   attempt (``Requeue``); every other class takes its step from the outcome table.

These checks run on the claim's context read. The dispatch checkpoint repeats the pin
checks of rules 2 and 5 in its own statement (:func:`checkpoint_refusal`, against the
pins the request was built for: :class:`DispatchPins`), because the claim may wait
between the two (a token refresh elsewhere, a quota slot): a pin that moved meanwhile
refuses the checkpoint, and :func:`refused_before_dispatch` settles that refusal as
rule 5 would.

Windows: L2 may only lengthen what L1 declares (the configuration refuses a
shorter one); the decision uses the longer of the two, so a binding can
never shorten a proof of absence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import attrs

from daemon.core.effects import (
    Classification,
    Evidence,
    OutcomeClass,
    Reconciled,
    RemoteSnapshot,
    reconcile,
)
from daemon.core.handoff import NoEffectReason
from daemon.core.no_effect import AttemptFacts, evidence_of, no_effect_proof

R = TypeVar("R")

_APPLIED_DISPOSITIONS = frozenset({"proven_applied", "operator_applied"})


# ------------------------------------------------------------------ inputs


@attrs.frozen(kw_only=True)
class CommandView:
    command_id: str
    settlement: str  # "open" or a terminal settlement
    intent_kind: str
    # The durable PrincipalBinding generation pinned at admission (None: never pinned).
    binding_generation: int | None
    # Pinned at admission (None: admitted before pins, or no link existed then).
    link_key: str | None
    link_generation: int | None
    remote_id: str | None
    # The pinned Catalog revision and its digest ("": admitted before digests were pinned).
    catalog_revision: int = 0
    catalog_digest: str = ""


@attrs.frozen(kw_only=True)
class DispatchPins:
    """The identity and revision one request was built for: its command's pins, as the
    claim used them. The dispatch checkpoint carries them and refuses the attempt unless
    every one is still current (:func:`checkpoint_refusal`)."""

    binding_generation: int
    link_key: str
    link_generation: int
    remote_id: str
    catalog_revision: int
    # The digest of the Catalog content the request was built from.
    catalog_digest: str


class CurrentBinding(Protocol):
    """A binding's durable generation and state as they are now."""

    @property
    def generation(self) -> int: ...

    @property
    def connected(self) -> bool: ...


@attrs.frozen(kw_only=True)
class OperationView:
    """The operation definition the command pinned, as far as the decision needs it."""

    name: str
    intent_kinds: frozenset[str]
    max_in_flight_s: float  # L1
    max_clock_skew_s: float = 0.0  # L1
    # How long the provider honours an idempotency key (L1's replay proof; None: no
    # proof). A maybe-applied attempt is replayed only within it.
    replay_retention_s: float | None = None


@attrs.frozen(kw_only=True)
class BindingView:
    """The L2 binding as it is now: its definition from the pinned revision, its
    generation and state from the durable PrincipalBinding."""

    generation: int
    connected: bool
    has_token: bool
    # The token comes from a grant that can be refreshed (a 401 earns one refresh).
    refreshable: bool = False
    # When the client gives up on an exchange at the latest (the shell enforces it).
    client_deadline_s: float
    max_in_flight_s: float = 0.0  # L2; 0 means L1's
    max_clock_skew_s: float = 0.0  # L2


@attrs.frozen(kw_only=True)
class LinkView:
    """The remote link at the pinned key, as it is now."""

    state: str
    generation: int
    remote_id: str | None


@attrs.frozen(kw_only=True)
class AttemptView:
    attempt_id: str
    outcome: str | None
    evidence: str | None
    disposition: str | None
    dispatched_at_us: int
    gave_up_at_us: int | None
    failure_class: str | None = None
    # The provider's last-modified time of the record as our latest accepted change left
    # it, known before this dispatch (its pre-dispatch evidence); None: unknown.
    unchanged_since_us: int | None = None

    @property
    def unresolved(self) -> bool:
        if self.disposition is not None:
            return False
        return self.outcome is None or self.outcome == OutcomeClass.OUTCOME_UNKNOWN

    @property
    def applied(self) -> bool:
        return self.outcome == OutcomeClass.ACCEPTED or self.disposition in _APPLIED_DISPOSITIONS

    @property
    def facts(self) -> AttemptFacts:
        return AttemptFacts(self.outcome, self.evidence, self.disposition)


@attrs.frozen
class Readback:
    """What the shell's read-back of the pinned record showed (or why it failed)."""

    snapshot: RemoteSnapshot | None
    error: str = ""


@attrs.frozen(kw_only=True)
class ClaimView(Generic[R]):
    """Everything one claim decides from, read once."""

    command: CommandView | None
    operation: OperationView | None
    binding: BindingView | None
    link: LinkView | None
    attempts: tuple[AttemptView, ...] = ()
    # The request the executor prepared for the pinned target, or why it could not.
    request: R | None = None
    request_error: str = ""
    # The values the command asks for (what a read-back must show).
    desired: Mapping[str, str | None] = attrs.field(factory=dict)
    readback: Readback | None = None
    now_us: int = 0
    # Why the command's pinned Catalog revision cannot be used (code, sentence), if so.
    catalog_refusal: tuple[str, str] | None = None


# ------------------------------------------------------------------ steps


@attrs.frozen
class Nothing:
    """Settled already: nothing to do."""

    reason: str


@attrs.frozen
class Reconcile:
    """Read the pinned record back, then decide again with the read-back."""

    attempt_ids: tuple[str, ...]
    fields: tuple[str, ...]


@attrs.frozen
class RecordAbsent:
    """Record that these attempts are proven absent, then decide again."""

    attempt_ids: tuple[str, ...]


@attrs.frozen
class SettleSuccess:
    """Persist the success result (format 1) with the pinned remote id."""

    remote_id: str
    # Unresolved attempts the read-back proved applied (recorded with the settlement).
    proven_applied: tuple[str, ...] = ()
    # The record's last-modified time the accepted answer named (kept with the
    # settlement: a later read-back still showing it proves a lost change absent).
    modified_at_us: int | None = None


@attrs.frozen
class SettleNoEffect:
    """A refusal the history proves effect-free: persist ``NO_EFFECT`` (format 2)."""

    code: str
    sentence: str
    reason: NoEffectReason


@attrs.frozen
class Blocked:
    """Fail closed and wait for an operator (the item is dead, with this reason)."""

    code: str
    sentence: str


@attrs.frozen
class Wait:
    """Nothing can be decided now: try again later."""

    code: str
    sentence: str
    delay_s: float | None = None


@attrs.frozen
class Requeue:
    """Nothing left and nothing failed: our own quota or send gate held the request back
    (its send slot expired waiting, say, for a free connection). The claim is given
    back unstarted at once, charging no attempt: contention never kills work."""

    code: str
    sentence: str


@attrs.frozen
class Dispatch(Generic[R]):
    """Write the checkpoint, then send exactly this request."""

    request: R


Step = Nothing | Reconcile | RecordAbsent | SettleSuccess | SettleNoEffect | Blocked | Wait \
    | Requeue | Dispatch[R]


# ------------------------------------------------------------------ rules


def in_flight_window_s(operation: OperationView, binding: BindingView | None) -> float:
    """The provider's in-flight window: L2 may lengthen L1's, never shorten it."""
    l2 = binding.max_in_flight_s if binding is not None else 0.0
    return max(operation.max_in_flight_s, l2)


def clock_skew_s(operation: OperationView, binding: BindingView | None) -> float:
    l2 = binding.max_clock_skew_s if binding is not None else 0.0
    return max(operation.max_clock_skew_s, l2)


def target_refusal(command: CommandView, binding: CurrentBinding | None,
                   link: LinkView | None) -> tuple[str, str] | None:
    """Why the command's pinned targets are no longer current (code, sentence)."""
    if command.link_key is None:
        return ("unpinned_command", "the command was accepted before targets were pinned;"
                " issue a repair command to pin the current ones")
    if binding is None:
        return ("binding_missing", "the command's binding is no longer configured")
    if command.binding_generation is None:
        return ("unpinned_binding", "the command pins no durable binding generation;"
                " issue a repair command to pin the current one")
    if not binding.connected:
        return ("binding_disconnected", "the pinned binding is disconnected")
    if binding.generation != command.binding_generation:
        return ("binding_generation", f"the pinned binding generation"
                f" {command.binding_generation} is no longer current ({binding.generation})")
    if command.link_generation is None or command.remote_id is None:
        return ("no_remote_link", "no remote link existed for the record when the command"
                " was accepted")
    if link is None or link.state != "active":
        return ("link_inactive", "the pinned remote link is no longer active")
    if link.generation != command.link_generation:
        return ("link_generation", f"the pinned remote link generation"
                f" {command.link_generation} is no longer current ({link.generation})")
    if link.remote_id != command.remote_id:
        return ("remote_id_changed", "the pinned remote record is no longer the linked one")
    return None


def checkpoint_refusal(command: CommandView, sent: DispatchPins,
                       binding: CurrentBinding | None, link: LinkView | None,
                       stored_digest: str | None) -> tuple[str, str] | None:
    """Why the dispatch checkpoint refuses a request built for ``sent`` (code, sentence),
    from what its own transaction reads: the command's pins, the binding and the link as
    they are now, and the stored digest of the pinned Catalog revision (None: not
    stored). The same rules as :func:`target_refusal` and the pinned-revision check of
    :func:`decide`, so a pin that moved after the claim read its context refuses the
    attempt before any byte leaves, with the reason the next claim would give."""
    revision, digest = command.catalog_revision, command.catalog_digest
    if stored_digest is None or (digest and stored_digest != digest):
        return ("catalog_revision_unavailable", f"the pinned Catalog revision {revision}"
                f" ({digest or 'no digest'}) is not stored")
    if (sent.catalog_revision, sent.catalog_digest) != (revision, stored_digest):
        return ("catalog_revision", f"the request was built from Catalog revision"
                f" {sent.catalog_revision} ({sent.catalog_digest}), not the pinned revision"
                f" {revision} ({stored_digest})")
    refusal = target_refusal(command, binding, link)
    if refusal is not None:
        return refusal
    if (sent.binding_generation, sent.link_key, sent.link_generation, sent.remote_id) != (
            command.binding_generation, command.link_key, command.link_generation,
            command.remote_id):
        return ("dispatch_pins_differ", "the request was built for another binding"
                " generation, link or remote record than the command pinned")
    return None


def refused_before_dispatch(view: ClaimView[R], code: str, sentence: str) -> Step[R]:
    """The step after the dispatch checkpoint refused a moved pin (``code``): no attempt
    of this claim reached provider I/O, so the refusal settles as any refusal before
    dispatch does (``NO_EFFECT`` when the history proves it, otherwise blocked)."""
    command = view.command
    assert command is not None
    return _refuse(command, [a.facts for a in view.attempts], code, sentence)


def _refuse(command: CommandView, history: Sequence[AttemptFacts], code: str,
            sentence: str) -> SettleNoEffect | Blocked:
    proof = no_effect_proof(command.intent_kind, history)
    if proof.reason is not None:
        return SettleNoEffect(code, sentence, proof.reason)
    return Blocked(code, f"{sentence}; no no-effect result: {proof.sentence};"
                   " operator repair needed")


def _exchange_end_us(a: AttemptView, binding: BindingView | None) -> int:
    """The later of the dispatch and the moment the client gave up on it."""
    end = a.gave_up_at_us
    if end is None:  # recorded before give-up times were: the client's deadline bounds it
        deadline = binding.client_deadline_s if binding is not None else 0.0
        end = a.dispatched_at_us + int(deadline * 1_000_000)
    return max(a.dispatched_at_us, end)


def _reconcile(view: ClaimView[R], unresolved: list[AttemptView]) -> Step[R]:
    command, op, binding = view.command, view.operation, view.binding
    assert command is not None
    if op is None:
        return Wait("reconcile_unavailable", "the pinned operation is not served; cannot"
                    " read back", 60.0)
    refusal = target_refusal(command, binding, view.link)
    if refusal is not None:
        return Blocked(refusal[0], f"{refusal[1]}; an unresolved attempt cannot be read"
                       " back with another identity: operator disposition needed")
    assert binding is not None and command.remote_id is not None
    if not binding.has_token:
        return Blocked("outcome_unknown", "cannot read back (no credentials): operator"
                       " disposition needed")
    ids = tuple(a.attempt_id for a in unresolved)
    if view.readback is None:
        return Reconcile(ids, tuple(sorted(view.desired)))
    if view.readback.snapshot is None:
        return Wait("reconcile_read_failed", view.readback.error or "read-back failed")
    # One command's attempts are sequential and none of them was accepted, so each found
    # the link as the same accepted change left it; differing (or unknown) times prove
    # nothing.
    stamps = {a.unchanged_since_us for a in unresolved}
    verdict = reconcile(
        view.desired, view.readback.snapshot,
        earliest_dispatch_us=min(a.dispatched_at_us for a in unresolved),
        latest_dispatch_us=max(_exchange_end_us(a, binding) for a in unresolved),
        now_us=view.now_us, clock_skew_us=int(clock_skew_s(op, binding) * 1_000_000),
        max_in_flight_us=int(in_flight_window_s(op, binding) * 1_000_000),
        unchanged_since_us=stamps.pop() if len(stamps) == 1 else None,
    )
    if verdict.verdict is Reconciled.APPLIED:
        return SettleSuccess(command.remote_id, ids)
    if verdict.verdict is Reconciled.ABSENT:
        return RecordAbsent(ids)
    if verdict.retry_after_s is not None:
        return Wait("outcome_unknown", "waiting out the provider's in-flight window",
                    verdict.retry_after_s + 0.5)
    return Wait("outcome_unknown", "read-back proves neither effect nor absence:"
                " operator disposition needed")


def credential_refusal(view: ClaimView[R], code: str, sentence: str,
                       verdict: Classification | None = None) -> Step[R]:
    """No token can be had for a definitive reason (``code``: needs re-authorization, no
    grant, a refused bundle): settled with that reason when the history (with the
    exchange just classified, if any) proves no effect, otherwise blocked."""
    command = view.command
    assert command is not None
    history = [a.facts for a in view.attempts]
    if verdict is not None:
        history.append(AttemptFacts(verdict.outcome.value, verdict.evidence.value))
    return _refuse(command, history, code, sentence)


def replay_unproven(a: AttemptView, operation: OperationView | None, now_us: int) -> bool:
    """A replay-safe retry that may have been applied, whose replay is no longer proven
    safe: the pinned operation declares no proof any more, or the provider's retention
    of the idempotency key has passed since that dispatch. It is reconciled, never
    replayed blindly."""
    if a.disposition is not None or a.outcome != OutcomeClass.REPLAY_SAFE_RETRY \
            or evidence_of(a.outcome, a.evidence) != Evidence.MAYBE_APPLIED:
        return False
    retention = operation.replay_retention_s if operation is not None else None
    return retention is None or now_us >= a.dispatched_at_us + int(retention * 1_000_000)


def decide(view: ClaimView[R]) -> Step[R]:
    """The one step this claim performs (see the module's rules)."""
    command = view.command
    if command is None:
        return Blocked("missing_command", "the command is missing")
    if command.settlement != "open":
        return Nothing(f"command already {command.settlement}")
    unresolved = [a for a in view.attempts
                  if a.unresolved or replay_unproven(a, view.operation, view.now_us)]
    if unresolved:
        return _reconcile(view, unresolved)
    history = [a.facts for a in view.attempts]
    if any(a.applied for a in view.attempts):
        if command.remote_id is None:
            return Blocked("no_remote_link", "applied, but no remote record was pinned:"
                           " operator repair needed")
        return SettleSuccess(command.remote_id)
    if view.catalog_refusal is not None:
        return _refuse(command, history, *view.catalog_refusal)
    op = view.operation
    if op is None:
        return _refuse(command, history, "unknown_operation",
                       "the pinned operation is not in the catalog")
    refusal = target_refusal(command, view.binding, view.link)
    if refusal is not None:
        return _refuse(command, history, *refusal)
    if command.intent_kind not in op.intent_kinds:
        return _refuse(command, history, "intent_kind",
                       f"{op.name} does not accept intent kind {command.intent_kind}")
    assert view.binding is not None
    if not view.binding.has_token:
        return Wait("no_credentials", "the binding has no token configured", 60.0)
    if view.request_error:
        return _refuse(command, history, "bad_request", view.request_error)
    if view.request is None:
        return Blocked("request_not_prepared", "no request was prepared for the pinned target")
    return Dispatch(view.request)


# The class of a provider's 401 (our access token was not accepted).
UNAUTHENTICATED = "http_401"


def after_attempt(view: ClaimView[R], verdict: Classification, what: str) -> Step[R]:
    """The step after the exchange just made (``view`` is the claim's view before it).

    A 401 with a refreshable grant is not a rejection of the effect but of the token:
    the first one earns one refresh and a retry (``token_rejected``); a 401 after an
    earlier one is a definitive authorization failure and settles like any rejection."""
    command = view.command
    assert command is not None and view.operation is not None
    if verdict.held:
        return Requeue(verdict.failure_class, f"held back before sending ({what}): nothing"
                       " was sent; no attempt is charged")
    if (verdict.outcome is OutcomeClass.REJECTED and verdict.failure_class == UNAUTHENTICATED
            and view.binding is not None and view.binding.refreshable
            and not any(a.failure_class == UNAUTHENTICATED for a in view.attempts)):
        return Wait("token_rejected", "the provider refused the access token (http_401):"
                    " refreshed once, the effect is retried", 0.0)
    match verdict.outcome:
        case OutcomeClass.ACCEPTED:
            assert command.remote_id is not None
            return SettleSuccess(command.remote_id)
        case OutcomeClass.REJECTED:
            history = [*(a.facts for a in view.attempts),
                       AttemptFacts(verdict.outcome.value, verdict.evidence.value)]
            return _refuse(command, history, verdict.failure_class,
                           f"the provider rejected the request ({what})")
        case OutcomeClass.RETRYABLE_PRE_DISPATCH | OutcomeClass.REPLAY_SAFE_RETRY:
            if verdict.evidence in (Evidence.NOT_SENT, Evidence.NOT_APPLIED):
                sentence = f"not applied ({what})"
            else:
                sentence = f"maybe applied ({what}); the contract proves a replay safe"
            return Wait(verdict.failure_class, sentence, verdict.retry_after_s)
        case _:
            return Wait("outcome_unknown", f"dispatch outcome unknown ({what}); reconciling",
                        in_flight_window_s(view.operation, view.binding))
