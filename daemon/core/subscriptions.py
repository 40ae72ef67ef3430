"""RemoteSubscription reconciliation's decisions (pure; seed 9, issue 10 item 8).

The rules the reconciler's shell (``daemon/services/subscriptions.py``) performs, each
provider call an effect attempt:

- The Catalog declares the *desired* subscriptions (name, resource, action, payload
  version, the route URL, the secret generation). Integration's *observed* rows hold, per
  name, the provider subscription id, the subscription generation, the secret generation,
  and the subscriptions being retired (a rotation's or a replacement's old one).
- The provider's list is the truth about what exists. A desired subscription with no row,
  or whose provider id the list no longer holds (deleted behind our back), is created under
  the next generation. One whose shape drifted (resource, action, URL, payload version) is
  replaced: the new one is created first, the old one retired, deleted once the new one is
  seen active.
- A secret rotation creates a new subscription with the new secret while the old one stays
  active (the verifier accepts both secrets); the old one is deleted only once a delivery
  verified with the new secret was seen. Nothing is ever without a live subscription.
- An orphan (a provider subscription to one of our routes that no row names) is deleted,
  and every delete carries the generation it was decided under: the shell's fenced write
  refuses it if the row moved on since (a reinstall, a concurrent reconcile), so a stale
  reconciler never deletes a live subscription.
- A provider-disabled subscription is reported (health), not recreated blindly: the provider
  re-enables it; a deleted one is recreated.
- One step (a create or a delete) whose earlier attempt's outcome is unknown is never sent
  again before the provider's in-flight window has passed since the client gave up on
  that attempt (:func:`decide_step`); only then is it reconciled by listing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs


@attrs.frozen(kw_only=True)
class Desired:
    name: str
    resource: str
    action: str
    payload_version: int
    url: str
    secret_generation: int


@attrs.frozen(kw_only=True)
class Observed:
    name: str
    provider_id: str
    generation: int
    secret_generation: int
    resource: str
    action: str
    url: str
    payload_version: int
    retiring: tuple[str, ...] = ()  # provider ids kept until their successor is proven
    # The retiring ones are a secret rotation's: proven only by a delivery verified with
    # the new secret (a replacement's are proven once the new one is active).
    rotating: bool = False


@attrs.frozen(kw_only=True)
class Remote:
    provider_id: str
    resource: str
    action: str
    url: str
    payload_version: int
    active: bool = True


@attrs.frozen
class Create:
    name: str
    generation: int
    reason: str  # missing | deleted_behind_our_back | drifted | secret_rotation


@attrs.frozen
class Delete:
    provider_id: str
    name: str | None  # the row it belonged to (None: an orphan no row names)
    expected_generation: int | None  # the row's generation when decided (the fence)
    reason: str  # orphan | replaced | rotated | undesired


@attrs.frozen
class Health:
    name: str
    active: bool


Step = Create | Delete | Health


def _shape(x: Desired | Observed | Remote) -> tuple[str, str, str, int]:
    return (x.resource, x.action, x.url, x.payload_version)


def decide(desired: Sequence[Desired], observed: Sequence[Observed], remote: Sequence[Remote],
           *, our_urls: Collection[str], new_secret_seen: Collection[str] = ()
           ) -> tuple[Step, ...]:
    """Every step that brings the provider to the desired state, in the order to perform."""
    steps: list[Step] = []
    by_id = {r.provider_id: r for r in remote}
    rows = {o.name: o for o in observed}
    wanted = {d.name for d in desired}
    referenced: set[str] = set()
    for d in sorted(desired, key=lambda d: d.name):
        row = rows.get(d.name)
        if row is None:
            steps.append(Create(d.name, 1, "missing"))
            continue
        referenced.update({row.provider_id, *row.retiring})
        live = by_id.get(row.provider_id)
        if live is None:
            steps.append(Create(d.name, row.generation + 1, "deleted_behind_our_back"))
            continue
        if not live.active:
            steps.append(Health(d.name, False))
        if _shape(live) != _shape(d):
            steps.append(Create(d.name, row.generation + 1, "drifted"))
            continue
        if d.secret_generation > row.secret_generation:
            steps.append(Create(d.name, row.generation + 1, "secret_rotation"))
            continue
        # The current subscription is right: its predecessors go once it is proven.
        proven = live.active and (not row.rotating or d.name in new_secret_seen)
        if row.retiring and proven:
            for old in row.retiring:
                if old in by_id:
                    steps.append(Delete(old, d.name, row.generation,
                                        "rotated" if row.rotating else "replaced"))
    for row in sorted(observed, key=lambda o: o.name):
        if row.name in wanted:
            continue
        referenced.update({row.provider_id, *row.retiring})
        for provider_id in (row.provider_id, *row.retiring):
            if provider_id in by_id:
                steps.append(Delete(provider_id, row.name, row.generation, "undesired"))
    for r in sorted(remote, key=lambda r: r.provider_id):
        if r.url in our_urls and r.provider_id not in referenced:
            steps.append(Delete(r.provider_id, None, None, "orphan"))
    return tuple(steps)


def delete_allowed(step: Delete, current_generation: int | None) -> bool:
    """The fence a delete is performed under: the row it was decided for is still at that
    generation (an orphan's delete needs the row to still not exist)."""
    return step.expected_generation == current_generation


# ------------------------------------------------------------------ one step's claim


@attrs.frozen(kw_only=True)
class StepAttempt:
    """One earlier attempt of the step (its effect-journal row)."""

    attempt_id: str
    dispatched_at_us: int
    # When the client gave up on the exchange (None: recorded before give-up times were).
    gave_up_at_us: int | None
    # Dispatched with no proven outcome (unknown, or none recorded) and no disposition.
    unresolved: bool


@attrs.frozen
class Send:
    """No attempt is in doubt: write the checkpoint, then send."""


@attrs.frozen
class ReadBack:
    """The in-flight window has passed: list, then record each attempt's disposition."""

    attempt_ids: tuple[str, ...]


@attrs.frozen
class WaitWindow:
    """An attempt may still be applied: nothing is sent, nor read, before ``until_us``."""

    until_us: int


StepClaim = Send | ReadBack | WaitWindow


def decide_step(attempts: Sequence[StepAttempt], *, max_in_flight_us: int,
                clock_skew_us: int, client_deadline_us: int, now_us: int) -> StepClaim:
    """What one claim of a step may do. An unresolved attempt may be applied by the
    provider until the in-flight window (plus the clock skew) has passed since the later
    of its dispatch and the client's give-up (the client's deadline when that was never
    recorded: a killed claimant). Before then a list proves nothing (a create may land
    after it) and a new request could be a second effect."""
    unresolved = [a for a in attempts if a.unresolved]
    if not unresolved:
        return Send()
    end = max(max(a.dispatched_at_us, a.gave_up_at_us if a.gave_up_at_us is not None
                  else a.dispatched_at_us + client_deadline_us) for a in unresolved)
    until = end + max(0, max_in_flight_us) + max(0, clock_skew_us)
    if now_us < until:
        return WaitWindow(until)
    return ReadBack(tuple(a.attempt_id for a in unresolved))


# ------------------------------------------------------------------ what a run skips


@attrs.frozen(kw_only=True)
class LaneStep:
    """One step item of a binding's lane as a run reads it."""

    subject: str  # the row's name (an orphan's delete: the provider id)
    create: bool
    state: str  # its WorkItem's state
    # An attempt of it was dispatched with no proven outcome and no disposition.
    unresolved: bool
    # That attempt carried another binding generation's identity than the binding's now
    # (a reconnect since, perhaps to another account): a list now cannot read it back.
    foreign: bool = False


# A step in one of these states has not finished: the run decides nothing for its subject.
LIVE_STEP_STATES = frozenset({"pending", "processing", "retry"})


@attrs.frozen
class InFlight:
    """What a run must not decide over (issue 22)."""

    # A step of the subject is still queued or running: it is decided again after it.
    busy: frozenset[str]
    # A create that finished (dead, cancelled, or let go) with an attempt whose outcome is
    # unknown: the provider may still apply it. The subscription it may have made is not
    # an orphan, and a create decided again must first wait out that attempt's in-flight
    # window and read it back (its step claims with that attempt: :func:`decide_step`).
    in_doubt: frozenset[str]
    # Such a create whose unresolved attempt carried another binding generation: no list
    # the binding can make now reads it back, so nothing is decided for the subject until
    # an operator records that attempt's disposition (as for the step itself, dead with
    # ``binding_generation``).
    held: frozenset[str] = frozenset()


def in_flight(steps: Sequence[LaneStep]) -> InFlight:
    """Never turn an ambiguous effect into "no effect": a create step that ended while an
    attempt of it is unresolved still counts as in flight, whatever its state, until a
    read-back (or an operator) disposes that attempt. A delete left the same way does
    not: deleting a subscription twice is deleting it once (its absence is accepted)."""
    busy = frozenset(s.subject for s in steps if s.state in LIVE_STEP_STATES)
    ended = [s for s in steps if s.create and s.unresolved
             and s.state not in LIVE_STEP_STATES]
    held = frozenset(s.subject for s in ended if s.foreign)
    return InFlight(busy, frozenset(s.subject for s in ended) - held, held)
