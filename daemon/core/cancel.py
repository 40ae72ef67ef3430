"""What an operator's cancel means for a work item, per family (pure).

Rules first, then code. A family declares one :class:`CancelRule`
(``daemon/services/families.py``); :func:`decide_cancel` maps the rule, the
item's state and what its effect journal shows to one :class:`CancelVerdict`:

==================  ===================  ===========================================
rule                state                verdict
==================  ===================  ===========================================
any                 terminal             refuse: nothing left to cancel
``never``           pending/retry/proc.  refuse: the family carries a duty (a Runtime
                                         receipt must be delivered)
``anytime``         pending/retry        cancel now
``anytime``         processing           request: the claimant stops and acknowledges
``before_dispatch`` any live, with an    refuse: a request may be at the provider;
                    unresolved attempt   wait until the attempt is classified (or an
                                         operator records a disposition)
``before_dispatch`` pending/retry        cancel now
``before_dispatch`` processing           request: the claimant stops, and its dispatch
                                         checkpoint refuses once the request is made
==================  ===================  ===========================================

"Unresolved" is the journal's: an attempt checkpointed with no proven
outcome (in flight right now, ``OUTCOME_UNKNOWN``, or left without an
outcome), and no disposition.
"""

from __future__ import annotations

import enum

import attrs

from daemon.core.states import TERMINAL, WorkState


class CancelRule(enum.StrEnum):
    ANYTIME = "anytime"
    BEFORE_DISPATCH = "before_dispatch"
    NEVER = "never"


class CancelAction(enum.StrEnum):
    CANCEL = "cancel"  # pending/retry -> cancelled at once
    REQUEST = "request"  # processing: set cancel_requested; the claimant acknowledges
    REFUSE = "refuse"


@attrs.frozen
class CancelVerdict:
    action: CancelAction
    # A stable code and a sentence, for refusals.
    code: str = ""
    reason: str = ""


def decide_cancel(rule: CancelRule, state: WorkState, *, unresolved_attempt: bool,
                  family: str = "") -> CancelVerdict:
    """The one verdict for an operator's cancel of one item."""
    if state in TERMINAL:
        return CancelVerdict(CancelAction.REFUSE, "terminal",
                             f"the item is {state.value}; only pending, retry or processing"
                             " work can be cancelled")
    if state not in (WorkState.PENDING, WorkState.RETRY, WorkState.PROCESSING):
        return CancelVerdict(CancelAction.REFUSE, "not_cancellable",
                             f"the item is {state.value}; only pending, retry or processing"
                             " work can be cancelled")
    if rule is CancelRule.NEVER:
        return CancelVerdict(CancelAction.REFUSE, "family_not_cancellable",
                             f"{family or 'this'} work cannot be cancelled: it delivers a"
                             " persisted result the Runtime must receive")
    if rule is CancelRule.BEFORE_DISPATCH and unresolved_attempt:
        return CancelVerdict(CancelAction.REFUSE, "after_dispatch",
                             "an effect attempt was dispatched and its outcome is not"
                             " classified yet; wait until it is (or record a disposition)")
    if state is WorkState.PROCESSING:
        return CancelVerdict(CancelAction.REQUEST)
    return CancelVerdict(CancelAction.CANCEL)
