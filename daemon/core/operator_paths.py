"""Which operator action is allowed from which effect state, and the receipt it leads to.

Theory of operation
-------------------
Every Runtime intent ends with exactly one true terminal receipt (seed 003). An
operator repairs a command with five actions: record a **disposition** on an
unresolved attempt (applied or absent), **retire** the command, **repair** it (a
new command with lineage), **replay** its terminal work item, or **cancel** its
live work. This module is the one place that says, for each effect state of a
command, which of them is allowed, what it leads to, and, when refused, why (a
stable code and a sentence) and which *one* action leads to the receipt instead.
The storage methods that perform the actions refuse from the same table inside
their own transaction, the console shows the same advice, and the CLI prints the
same refusals; none of them decides on its own.

The states, from the facts of one command (:func:`effect_state`), in the order
they are told apart:

============= ==================================================================
answered      settled (success or no effect): the receipt is queued or confirmed
repaired      a repair command answers the Runtime intent instead
running       a WorkItem of the command is not terminal: its own result settles it
unresolved    an attempt's outcome is unknown: a disposition must come first
retired_applied retired (before this rule) although an attempt is proven applied
retired       retired without a receipt: nothing proved the outcome
applied       an attempt is proven applied (accepted, or a disposition of applied)
no_effect     every attempt of the lineage is proven effect-free
unproven      neither: an attempt may have applied (replay-safe retries exhausted)
============= ==================================================================

The rules, before the table:

* a proven-applied command always reaches its exact success receipt: **retire**
  settles it with the pinned remote id, at once, with no provider call (also a
  command retired before this rule); a replay or a repair of it is refused and
  names retire (a second call could only repeat the effect);
* a proven no-effect command: retire settles ``NO_EFFECT``; a replay dispatches
  again; a repair issues a new command whose result answers the intent;
* an unproven one: retire stops it *without* a receipt (then a repair is the way
  out), a replay dispatches again, a repair issues a new command;
* nothing but a disposition moves an unresolved attempt, and nothing moves a
  command whose work is running except that work (or a cancel of unclaimed work);
* settled, repaired and retired commands are never replayed: the replay would be
  accepted and then skipped.

Two facts beyond the state refine a replay and a repair: a newer intent for the
same record and field (``superseded``: both refused, the older value would
overwrite it) and pins that moved since admission (``pins_moved``: a replay runs
the same pinned command, so it is refused and a repair, pinned anew, is named).
The advice of a state (:func:`advice`) is always an action :func:`verdict`
allows for the same facts: the console never advises an action that is refused.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs


class Action(enum.StrEnum):
    # A disposition on the unresolved attempt, with the provider's evidence: applied
    # or absent (as advice: either, the evidence decides which).
    DISPOSE = "disposition"
    DISPOSE_APPLIED = "disposition_applied"
    DISPOSE_ABSENT = "disposition_absent"
    RETIRE = "retire"
    REPAIR = "repair"
    REPLAY = "replay"
    CANCEL = "cancel"


DISPOSITIONS = frozenset({Action.DISPOSE, Action.DISPOSE_APPLIED, Action.DISPOSE_ABSENT})


class EffectState(enum.StrEnum):
    ANSWERED = "answered"
    REPAIRED = "repaired"
    RUNNING = "running"
    UNRESOLVED = "unresolved"
    RETIRED_APPLIED = "retired_applied"
    RETIRED = "retired"
    APPLIED = "applied"
    NO_EFFECT = "no_effect"
    UNPROVEN = "unproven"


class Receipt(enum.StrEnum):
    """What the Runtime gets from an action."""

    SUCCESS = "success"  # the exact success result, at once
    NO_EFFECT = "no_effect"  # the no-effect result the lineage proves, at once
    BY_WORK = "by_work"  # the result of the work the action queued (success or no effect)
    NONE = "none"  # no receipt yet: the state it leaves names the next action


@attrs.frozen(kw_only=True)
class CommandFacts:
    """What the decision needs of one command, read in one transaction."""

    settlement: str  # open / succeeded / no_effect / retired
    repaired: bool = False
    # A WorkItem of the command is not terminal (pending, retry, processing, ...).
    live_work: bool = False
    unresolved: bool = False
    applied: bool = False
    # The whole lineage's history proves no effect (seed 003), for this intent kind.
    no_effect_proven: bool = False
    # A remote id was pinned at admission (a success receipt carries it).
    remote_id_pinned: bool = True
    # A newer intent for the same record shares a field with this one.
    superseded: bool = False
    # The binding generation or Catalog revision the command pinned is not current.
    pins_moved: bool = False


def effect_state(f: CommandFacts) -> EffectState:
    """The command's effect state (the module's table, top row first)."""
    if f.settlement in ("succeeded", "no_effect"):
        return EffectState.ANSWERED
    if f.repaired:
        return EffectState.REPAIRED
    if f.live_work:
        return EffectState.RUNNING
    if f.unresolved:
        return EffectState.UNRESOLVED
    if f.settlement == "retired":
        return EffectState.RETIRED_APPLIED if f.applied else EffectState.RETIRED
    if f.applied:
        return EffectState.APPLIED
    return EffectState.NO_EFFECT if f.no_effect_proven else EffectState.UNPROVEN


@attrs.frozen
class Allowed:
    """The action is allowed: the receipt it leads to and the state it leaves (None:
    as the command's history then shows, e.g. after a cancel)."""

    receipt: Receipt
    then: EffectState | None


@attrs.frozen
class Refused:
    """The action is refused: a stable code, a sentence, and the one action that leads
    to the receipt instead (None: none is needed, or none can prove the outcome)."""

    code: str
    sentence: str
    instead: Action | None = None

    def line(self, action: Action) -> str:
        """One line for the CLI, the console and the API's error body."""
        instead = f" Instead: {self.instead.value}." if self.instead is not None else ""
        return f"{action.value} refused ({self.code}): {self.sentence}.{instead}"


Verdict = Allowed | Refused

_A, _S = Action, EffectState

# The states in which each action is allowed, and what it leads to (before the
# refinements: a pinned remote id, superseded and pins_moved).
_ALLOWED: Mapping[tuple[EffectState, Action], Allowed] = {
    (_S.UNRESOLVED, _A.DISPOSE): Allowed(Receipt.NONE, None),
    (_S.UNRESOLVED, _A.DISPOSE_APPLIED): Allowed(Receipt.NONE, _S.APPLIED),
    (_S.UNRESOLVED, _A.DISPOSE_ABSENT): Allowed(Receipt.NONE, _S.NO_EFFECT),
    (_S.APPLIED, _A.RETIRE): Allowed(Receipt.SUCCESS, _S.ANSWERED),
    (_S.RETIRED_APPLIED, _A.RETIRE): Allowed(Receipt.SUCCESS, _S.ANSWERED),
    (_S.NO_EFFECT, _A.RETIRE): Allowed(Receipt.NO_EFFECT, _S.ANSWERED),
    (_S.UNPROVEN, _A.RETIRE): Allowed(Receipt.NONE, _S.RETIRED),
    (_S.NO_EFFECT, _A.REPLAY): Allowed(Receipt.BY_WORK, _S.RUNNING),
    (_S.UNPROVEN, _A.REPLAY): Allowed(Receipt.BY_WORK, _S.RUNNING),
    (_S.NO_EFFECT, _A.REPAIR): Allowed(Receipt.BY_WORK, _S.REPAIRED),
    (_S.UNPROVEN, _A.REPAIR): Allowed(Receipt.BY_WORK, _S.REPAIRED),
    (_S.RETIRED, _A.REPAIR): Allowed(Receipt.BY_WORK, _S.REPAIRED),
    # A cancel stops unclaimed work; running work it may stop is the family's cancel
    # rule's to decide (daemon/core/cancel.py): what is left is what the history shows.
    (_S.RUNNING, _A.CANCEL): Allowed(Receipt.NONE, None),
}

_APPLIED_SENTENCE = ("the command's effect is proven applied: retire settles its success"
                     " receipt (a second call could only repeat the effect)")
# Why each state refuses what it does not allow: (code, sentence).
_STATE_REFUSAL: Mapping[EffectState, tuple[str, str]] = {
    _S.ANSWERED: ("settled", "the command is settled and its Runtime receipt is queued or"
                  " confirmed; nothing is left to do"),
    _S.REPAIRED: ("repaired", "a repair command answers this Runtime intent; act on that"
                  " command"),
    _S.RUNNING: ("live_work", "the command's work is still running: its own result settles"
                 " it (cancel unclaimed work first to stop it)"),
    _S.UNRESOLVED: ("unresolved", "an attempt's outcome is unknown: record a disposition"
                    " (applied or absent, with the provider's evidence) first"),
    _S.RETIRED_APPLIED: ("proven_applied", _APPLIED_SENTENCE),
    _S.RETIRED: ("retired", "the command is retired: only a repair command can still answer"
                 " its Runtime intent"),
    _S.APPLIED: ("proven_applied", _APPLIED_SENTENCE),
    # (Every action but a disposition and a cancel is allowed from these two; those two
    # have their own refusals below. Listed so that every state has a row.)
    _S.NO_EFFECT: ("no_live_work", "the command has no live work"),
    _S.UNPROVEN: ("no_live_work", "the command has no live work"),
}
_NO_DISPOSITION = ("no_unresolved_attempt", "no attempt awaits a disposition")
_NO_LIVE_WORK = ("terminal", "the command has no live work to cancel")
_SUPERSEDED = ("superseded", "a newer intent for the same record and field exists: the"
               " older value would overwrite it")
_PINS_MOVED = ("pins_moved", "the binding generation or Catalog revision the command pinned"
               " is no longer current: a replay would run the old pins")
_NO_REMOTE_ID = ("no_remote_id", "applied, but no remote id was pinned at admission: no"
                 " success result can name the remote record")


def _base(state: EffectState, action: Action, f: CommandFacts) -> Verdict:
    allowed = _ALLOWED.get((state, action))
    if allowed is None:
        if action in DISPOSITIONS and state in (_S.APPLIED, _S.NO_EFFECT, _S.UNPROVEN,
                                                 _S.RETIRED, _S.RETIRED_APPLIED):
            return Refused(*_NO_DISPOSITION)
        if action is Action.CANCEL:
            return Refused(*_NO_LIVE_WORK)
        return Refused(*_STATE_REFUSAL[state])
    if state in (_S.APPLIED, _S.RETIRED_APPLIED) and not f.remote_id_pinned:
        return Refused(*_NO_REMOTE_ID)
    if action in (Action.REPLAY, Action.REPAIR) and f.superseded:
        return Refused(*_SUPERSEDED)
    if action is Action.REPLAY and f.pins_moved:
        return Refused(*_PINS_MOVED)
    return allowed


# The order in which an action is advised when several are allowed: the one that
# settles at once, with no provider call, first.
_PREFERENCE = (Action.RETIRE, Action.REPLAY, Action.REPAIR)


def advice(f: CommandFacts) -> Action | None:
    """The one action that leads this command to its true receipt. None: none is
    needed (its work, or its repair command, answers it, or it is answered), or none
    can prove the outcome (an unproven command a newer intent supersedes)."""
    state = effect_state(f)
    if state is _S.UNRESOLVED:
        return Action.DISPOSE
    for action in _PREFERENCE:
        found = _base(state, action, f)
        if isinstance(found, Allowed) and found.receipt is not Receipt.NONE:
            return action
    return None


def verdict(f: CommandFacts, action: Action) -> Verdict:
    """Whether ``action`` is allowed for a command with facts ``f``; a refusal names the
    one action that leads to the receipt instead (never one that is refused too)."""
    result = _base(effect_state(f), action, f)
    if isinstance(result, Refused):
        instead = advice(f)
        return attrs.evolve(result, instead=instead if instead is not action else None)
    return result


def advice_sentence(f: CommandFacts) -> str:
    """The advice as the console and ``work show`` print it."""
    state = effect_state(f)
    match advice(f):
        case Action.DISPOSE:
            return ("record a disposition on the unresolved attempt (applied or absent,"
                    " with the provider's evidence)")
        case Action.RETIRE:
            found = _base(state, Action.RETIRE, f)
            assert isinstance(found, Allowed)
            what = "success" if found.receipt is Receipt.SUCCESS else "no-effect result"
            return f"retire: settles the proven {what} and sends its Runtime receipt"
        case Action.REPLAY:
            return "replay its dead work item: the command runs again under its pins"
        case Action.REPAIR:
            return "issue a repair command: its result answers this Runtime intent"
    match state:
        case _S.ANSWERED:
            return "none: the Runtime receipt is queued or confirmed"
        case _S.REPAIRED:
            return "none here: the repair command's result answers this Runtime intent"
        case _S.RUNNING:
            return "none: the command's work is running and its result settles it"
        case _S.APPLIED | _S.RETIRED_APPLIED:
            return f"none: {_NO_REMOTE_ID[1]}; the Runtime intent keeps blocking"
    return ("none: a newer intent supersedes it and nothing proves its outcome; the"
            " Runtime intent keeps blocking")
