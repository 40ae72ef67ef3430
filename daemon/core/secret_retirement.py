"""When a rotated-out webhook secret may retire itself (pure; issue 10, docs/subscriptions.md).

After a secret rotation the verifier accepts the route's new secret and its previous one.
The previous one may stop being accepted only when nothing signed with it can still come:

1. every desired subscription of the route is listed active (by a reconcile run) under
   the route's current secret generation, with no old subscription left (none rotating,
   none retiring): the provider no longer *sends* with the old secret;
2. the provider's redelivery window (L1: how long after its first sending a copy of a
   delivery may still arrive) has passed since condition 1 was first seen (a delivery sent
   just before the old subscription went may still be redelivered until then); and
3. no receipt verified with the previous secret arrived within that window.

:func:`decide` gives one step for one route at one reading of the clock; the shell
performs it in the reconcile run's fenced finalization. ``watching`` (with the time to
look again) is stored first; ``Retire`` only from a watch at least one window old, so the
quiet window is measured from durable state, not from one run's memory. A condition 1
that stops holding (a new rotation, a subscription missing or disabled) drops the watch.
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class RetirementView:
    """What one decision sees of one route (times in epoch microseconds)."""

    has_previous: bool              # the route has a previous secret configured
    subscriptions_current: bool     # condition 1
    window_us: int | None           # the L1 redelivery window (None: not declared)
    state: str | None = None        # the stored row's: None | "watching" | "retired"
    watch_since_us: int | None = None
    # The newest receipt verified with the previous secret within the window before now.
    last_previous_receipt_us: int | None = None


@attrs.frozen
class Nothing:
    reason: str  # retired | no_previous_secret | no_redelivery_window | not_current


@attrs.frozen
class Watch:
    since_us: int
    check_at_us: int


@attrs.frozen
class Wait:
    check_at_us: int
    reason: str  # window_open | previous_secret_used


@attrs.frozen
class Retire:
    pass


@attrs.frozen
class Unwatch:
    pass


Decision = Nothing | Watch | Wait | Retire | Unwatch


def decide(view: RetirementView, now_us: int) -> Decision:
    if view.state == "retired":
        return Nothing("retired")
    if not view.has_previous:
        return Nothing("no_previous_secret")
    if view.window_us is None or view.window_us <= 0:
        return Nothing("no_redelivery_window")
    if not view.subscriptions_current:
        return Unwatch() if view.state == "watching" else Nothing("not_current")
    window = view.window_us
    if view.state != "watching" or view.watch_since_us is None:
        return Watch(now_us, now_us + window)
    last = view.last_previous_receipt_us
    if last is not None and last >= now_us - window:
        # The previous secret was used within the window: quiet for a window after it.
        return Wait(max(view.watch_since_us + window, last + window + 1),
                    "previous_secret_used")
    if now_us < view.watch_since_us + window:
        return Wait(view.watch_since_us + window, "window_open")
    return Retire()
