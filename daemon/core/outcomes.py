"""From a handler's outcome to a finalization decision (pure).

Handlers say *what happened*; this module decides *what the row becomes*:
retries are charged against ``max_attempts`` and delayed by the backoff
policy, or converted to ``dead`` when attempts are spent; a deferral (work that
cannot start before a known time) is charged nothing and runs at that time. The shell performs
the decision with one fenced write.
"""

from __future__ import annotations

import attrs

from daemon.core.retry import BackoffPolicy
from daemon.core.states import WorkEvent, WorkState, transition
from daemon.core.work import Fence, sanitize_summary


@attrs.frozen
class Succeeded:
    """The work is complete; nothing is left for an operator. ``terminal_outcome``
    records what completing meant (an effect command settled with a no-effect
    result completes as ``no_effect``, with the refusal's code)."""

    summary: str = ""
    terminal_outcome: str = "succeeded"
    failure_class: str | None = None


@attrs.frozen
class Skipped:
    reason: str


@attrs.frozen
class RetryLater:
    failure_class: str
    summary: str = ""
    # A provider-dictated delay (e.g. Retry-After) overrides the backoff policy.
    delay_s: float | None = None


@attrs.frozen
class DeadLetter:
    failure_class: str
    summary: str = ""


@attrs.frozen
class CancelAcknowledged:
    pass


@attrs.frozen
class Released:
    """The claimant gives the work back unstarted (graceful drain past its deadline)."""


@attrs.frozen
class Deferred:
    """The claimant gives the work back unstarted until ``run_after_us``: before
    anything was dispatched it learnt the exact time the work can start (the quota
    ledger's next free slot). Not a failure: no attempt is charged, and the row
    goes back to ``pending``; the execution journal records it with ``reason``."""

    reason: str = attrs.field(validator=attrs.validators.min_len(1))
    run_after_us: int = attrs.field(validator=attrs.validators.ge(0))
    summary: str = ""


Outcome = (Succeeded | Skipped | RetryLater | DeadLetter | CancelAcknowledged | Released
           | Deferred)


@attrs.frozen(kw_only=True)
class Finalization:
    """One fenced transition out of ``processing``."""

    fence: Fence
    event: WorkEvent
    # The attempt number the claim charged, and the family (execution journal).
    attempt: int = 0
    family: str = ""
    run_after_us: int | None = None
    terminal_outcome: str | None = None
    failure_class: str | None = None
    summary: str | None = None
    # Release and deferral give back the attempt the claim charged.
    refund_attempt: bool = False

    @property
    def new_state(self) -> WorkState:
        return transition(WorkState.PROCESSING, self.event)


def decide(
    outcome: Outcome,
    *,
    fence: Fence,
    attempt: int,
    max_attempts: int,
    policy: BackoffPolicy,
    jitter_sample: float,
    now_us: int,
    family: str = "",
) -> Finalization:
    """Turn a handler outcome into the finalization to commit."""
    match outcome:
        case Succeeded(summary=summary, terminal_outcome=terminal, failure_class=failure):
            return Finalization(
                fence=fence,
                attempt=attempt,
                family=family,
                event=WorkEvent.COMPLETE,
                terminal_outcome=terminal,
                failure_class=failure,
                summary=sanitize_summary(summary) or None,
            )
        case Skipped(reason=reason):
            return Finalization(
                fence=fence,
                attempt=attempt,
                family=family,
                event=WorkEvent.SKIP,
                terminal_outcome="skipped",
                summary=sanitize_summary(reason),
            )
        case RetryLater(failure_class=failure_class, summary=summary, delay_s=delay_s):
            if attempt >= max_attempts:
                return Finalization(
                    fence=fence,
                    attempt=attempt,
                family=family,
                    event=WorkEvent.DEAD_LETTER,
                    terminal_outcome="dead",
                    failure_class=failure_class,
                    summary=sanitize_summary(f"attempts exhausted ({attempt}): {summary}"),
                )
            delay = delay_s if delay_s is not None else policy.delay_s(attempt, jitter_sample)
            return Finalization(
                fence=fence,
                attempt=attempt,
                family=family,
                event=WorkEvent.RETRY,
                run_after_us=now_us + int(delay * 1_000_000),
                failure_class=failure_class,
                summary=sanitize_summary(summary) or None,
            )
        case DeadLetter(failure_class=failure_class, summary=summary):
            return Finalization(
                fence=fence,
                attempt=attempt,
                family=family,
                event=WorkEvent.DEAD_LETTER,
                terminal_outcome="dead",
                failure_class=failure_class,
                summary=sanitize_summary(summary) or None,
            )
        case CancelAcknowledged():
            return Finalization(
                fence=fence,
                attempt=attempt,
                family=family,
                event=WorkEvent.CANCEL_ACK,
                terminal_outcome="cancelled",
                summary="cancelled by operator request",
            )
        case Released():
            return Finalization(
                fence=fence,
                attempt=attempt,
                family=family,
                event=WorkEvent.RELEASE,
                run_after_us=now_us,
                failure_class="released",
                summary="released unfinished during drain",
                refund_attempt=True,
            )
        case Deferred(reason=reason, run_after_us=run_after_us, summary=summary):
            return Finalization(
                fence=fence,
                attempt=attempt,
                family=family,
                event=WorkEvent.DEFER,
                run_after_us=max(run_after_us, now_us),
                failure_class=reason,
                summary=sanitize_summary(summary) or None,
                refund_attempt=True,
            )
