"""The attempts that reached (or may have reached) the provider.

An end-to-end slice runs on the wall clock beside a real database: when the
checkpoint outlasts a quota slot's jitter (250 ms) or no connection of ours is
free in time, the runner holds the request back (``Phase.HELD``). That attempt
is journaled as RETRYABLE_PRE_DISPATCH / not_sent with a held class, and the
claim is given back uncharged: nothing left, nothing failed. Such a hold is a
fact about a loaded machine, not about the provider's faults a test injects, so
tests that assert the exchanges with the provider look past it, and only it.
"""

from __future__ import annotations

from collections.abc import Sequence

from daemon.core.effects import HELD_CLASSES, Evidence, OutcomeClass
from storage.effect_values import EffectAttempt

# The classes classify() gives a hold: one per known detail, and "quota_held" for
# any other (daemon.core.effects.classify).
_HELD = frozenset(HELD_CLASSES.values()) | {"quota_held"}


def held_by_us(attempt: EffectAttempt) -> bool:
    """Our own side held this attempt back before any byte left."""
    return (attempt.outcome == OutcomeClass.RETRYABLE_PRE_DISPATCH.value
            and attempt.evidence == Evidence.NOT_SENT.value
            and attempt.failure_class in _HELD)


def sent_attempts(attempts: Sequence[EffectAttempt]) -> list[EffectAttempt]:
    """``attempts`` without those held back by our own side (a refused connect, or any
    other outcome, stays)."""
    return [a for a in attempts if not held_by_us(a)]
