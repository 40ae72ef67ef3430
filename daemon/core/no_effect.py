"""When a command may be settled with ``NO_EFFECT`` (seed 003), as one pure function.

Theory of operation
-------------------
A ``ResourceNoEffectResultV1`` tells the Runtime that nothing happened at the
provider, and the Runtime then releases the intent's owner guard. So it may be
claimed only from *proof*, attempt by attempt, never from a class name, an
age or a contract's replay promise. The rules, before code:

* Only ``UPSERT`` and ``DELETE`` intents admit the result at all.
* No attempt at all, or every attempt failed before a byte left
  (evidence ``not_sent``): ``REJECTED_BEFORE_DISPATCH``.
* Otherwise **every** attempt must be proven effect-free, whichever came
  last, so a definitive failure of the latest attempt never hides an earlier
  unresolved one:

  - a disposition of absence (reconciliation's ``proven_absent`` or an
    operator's ``operator_absent``, with evidence) proves it;
  - evidence ``not_sent`` or ``not_applied`` (a terminal 4xx, a status the
    L1 contract declares not-applied) proves it, when the class agrees with
    the evidence;
  - anything else refuses: applied (``ACCEPTED``, a disposition of
    applied: a partial mutation is a mutation), unresolved (no outcome after
    the checkpoint: a crash, an expired lease, a cancel mid-dispatch; or
    ``OUTCOME_UNKNOWN``), maybe applied (a timeout, reset or 5xx, even when
    the contract calls the operation replay-safe, and so also after retry
    exhaustion), or evidence that contradicts its class.

Rows written before evidence was recorded carry none; they are read
conservatively (:func:`evidence_of`): a ``REPLAY_SAFE_RETRY`` without
evidence is *maybe applied*.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

import attrs

from daemon.core.effects import Evidence, OutcomeClass
from daemon.core.handoff import NO_EFFECT_INTENT_KINDS, NoEffectReason


@attrs.frozen
class AttemptFacts:
    """What the proof needs of one attempt: its class, evidence and disposition."""

    outcome: str | None
    evidence: str | None = None
    disposition: str | None = None


class Refusal(enum.StrEnum):
    """Why no ``NO_EFFECT`` may be claimed (stable codes, worst first)."""

    INTENT_KIND = "no_effect_intent_kind"
    APPLIED = "attempt_applied"
    UNRESOLVED = "attempt_unresolved"
    MAYBE_APPLIED = "attempt_maybe_applied"
    INCONSISTENT = "attempt_evidence_inconsistent"


_SENTENCES: Mapping[Refusal, str] = {
    Refusal.INTENT_KIND: "only UPSERT and DELETE intents admit a no-effect result",
    Refusal.APPLIED: "an attempt was applied at the provider",
    Refusal.UNRESOLVED: "an attempt's outcome is unresolved (unknown, or no outcome after"
                        " its dispatch checkpoint)",
    Refusal.MAYBE_APPLIED: "an attempt may have been applied (timeout, reset or server error"
                           " after sending); a replay-safe contract is no proof of no effect",
    Refusal.INCONSISTENT: "an attempt's evidence contradicts its outcome class",
}

_ORDER = tuple(Refusal)

# Dispositions recorded on unresolved attempts.
_ABSENT = frozenset({"proven_absent", "operator_absent"})
_APPLIED = frozenset({"proven_applied", "operator_applied"})

# Which evidence each class may carry.
_CONSISTENT: Mapping[str, frozenset[str]] = {
    OutcomeClass.RETRYABLE_PRE_DISPATCH: frozenset({Evidence.NOT_SENT}),
    OutcomeClass.REJECTED: frozenset({Evidence.NOT_APPLIED}),
    OutcomeClass.REPLAY_SAFE_RETRY: frozenset({Evidence.NOT_APPLIED, Evidence.MAYBE_APPLIED}),
    OutcomeClass.ACCEPTED: frozenset({Evidence.APPLIED}),
    OutcomeClass.OUTCOME_UNKNOWN: frozenset({Evidence.MAYBE_APPLIED}),
}

# Evidence of rows that predate its recording, per class: conservative.
_LEGACY: Mapping[str, Evidence] = {
    OutcomeClass.RETRYABLE_PRE_DISPATCH: Evidence.NOT_SENT,
    OutcomeClass.REJECTED: Evidence.NOT_APPLIED,
    OutcomeClass.REPLAY_SAFE_RETRY: Evidence.MAYBE_APPLIED,
    OutcomeClass.ACCEPTED: Evidence.APPLIED,
    OutcomeClass.OUTCOME_UNKNOWN: Evidence.MAYBE_APPLIED,
}


def evidence_of(outcome: str | None, stored: str | None) -> str | None:
    """The attempt's evidence; rows without one get the conservative reading."""
    if stored is not None:
        return stored
    if outcome is None:
        return None
    legacy = _LEGACY.get(outcome)
    return legacy.value if legacy is not None else None


def _attempt_refusal(a: AttemptFacts) -> Refusal | None:
    """None when this attempt is proven effect-free."""
    if a.disposition in _APPLIED:
        return Refusal.APPLIED
    if a.disposition in _ABSENT:
        return None
    if a.disposition is not None:
        return Refusal.INCONSISTENT  # a disposition this build does not know
    if a.outcome is None or a.outcome == OutcomeClass.OUTCOME_UNKNOWN:
        return Refusal.UNRESOLVED
    if a.outcome == OutcomeClass.ACCEPTED:
        return Refusal.APPLIED
    evidence = evidence_of(a.outcome, a.evidence)
    if evidence not in _CONSISTENT.get(a.outcome, frozenset()):
        return Refusal.INCONSISTENT
    if evidence in (Evidence.NOT_SENT, Evidence.NOT_APPLIED):
        return None
    return Refusal.MAYBE_APPLIED


@attrs.frozen
class NoEffectProof:
    """The reason a no-effect result may be claimed, or why not (code + sentence)."""

    reason: NoEffectReason | None
    refusal: Refusal | None = None

    @property
    def proven(self) -> bool:
        return self.reason is not None

    @property
    def sentence(self) -> str:
        return _SENTENCES[self.refusal] if self.refusal is not None else ""


def no_effect_proof(intent_kind: str, attempts: Sequence[AttemptFacts]) -> NoEffectProof:
    """Whether the command's whole history proves that it had no external effect."""
    if intent_kind not in NO_EFFECT_INTENT_KINDS:
        return NoEffectProof(None, Refusal.INTENT_KIND)
    refusals = {r for r in map(_attempt_refusal, attempts) if r is not None}
    if refusals:
        return NoEffectProof(None, min(refusals, key=_ORDER.index))
    if all(a.disposition is None and a.outcome == OutcomeClass.RETRYABLE_PRE_DISPATCH
           for a in attempts):
        return NoEffectProof(NoEffectReason.REJECTED_BEFORE_DISPATCH)  # also: none at all
    return NoEffectProof(NoEffectReason.DEFINITIVE_NO_EFFECT)
