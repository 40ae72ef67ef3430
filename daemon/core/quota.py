"""Provider quota as a schedule of send slots: pure decisions, no I/O.

Theory of operation
-------------------
A provider limits requests per window (``limit`` per ``window``: 100 per 10 s, 10,000 per
hour). integrationd keeps, per quota key, one *theoretical arrival time* (TAT, the GCRA
shape): the earliest time the next request may be sent. A grant of ``n`` slots hands out
the send times ``start, start + I, ..., start + (n-1)·I`` with ``start = max(TAT, now)``
and moves the TAT to ``start + n·I``. Slots are therefore spaced at least ``I`` apart,
whichever replica holds them.

A slot is a *time window* ``[slot, slot + jitter)``: a request may be sent at or after its
slot and must start before the slot expires (a slot not used by then is dropped, never
sent late). So two sends are at least ``I - jitter`` apart, and any half-open interval
of length ``window`` sees at most ``ceil((window + jitter) / I)`` sends. Choosing

    I = ceil((window + jitter) / limit)

makes that at most ``limit``: the provider's own window can never be exceeded, whatever
the number of replicas or how late a sender starts within its slot (the jitter also
absorbs network arrival jitter). The cost is throughput: ``window / (window + jitter)``
of the limit (97.5 % for 100 per 10 s with a 250 ms jitter).

A provider 429 with ``Retry-After`` (or a reset time) *blocks* the key until then for
every replica: no slot starts before it. Slots are never borrowed from the future beyond
``max_wait``: work that would have to wait longer is told when to come back, so the
scheduler can run it at exactly that time instead of retrying with backoff.
"""

from __future__ import annotations

import enum
import math

import attrs


class QuotaPolicyError(ValueError):
    """A quota definition that cannot be enforced (zero or negative limit or window)."""


@attrs.frozen(kw_only=True)
class QuotaPolicy:
    """One quota dimension of one provider (L1), with L2's scope folded into the key."""

    limit: int
    window_us: int
    # How late a send may start within its slot (and how much arrival jitter is absorbed).
    jitter_us: int = 250_000

    def __attrs_post_init__(self) -> None:
        if isinstance(self.limit, bool) or self.limit <= 0:
            raise QuotaPolicyError(f"limit must be a positive integer, got {self.limit}")
        if self.window_us <= 0:
            raise QuotaPolicyError(f"window must be positive, got {self.window_us} us")
        if self.jitter_us < 0:
            raise QuotaPolicyError(f"jitter must not be negative, got {self.jitter_us} us")

    @property
    def interval_us(self) -> int:
        """The spacing between two slots of this key."""
        return max(1, math.ceil((self.window_us + self.jitter_us) / self.limit))

    def max_sends_in_window(self) -> int:
        """The most sends any window of the provider's length can see (always <= limit)."""
        return math.ceil((self.window_us + self.jitter_us) / self.interval_us)


@attrs.frozen
class QuotaState:
    """The shared budget row of one quota key."""

    tat_us: int = 0
    # No slot may start before this (a provider 429's Retry-After, for everyone).
    blocked_until_us: int = 0


@attrs.frozen
class Granted:
    """Send times ``slots`` (each valid until ``slot + jitter``); the row moves to ``state``."""

    slots: tuple[int, ...]
    state: QuotaState


@attrs.frozen
class Wait:
    """Nothing granted; ``until_us`` is the earliest time a grant of this size can succeed."""

    until_us: int


def grant(policy: QuotaPolicy, state: QuotaState, *, now_us: int, count: int = 1,
          max_wait_us: int = 0) -> Granted | Wait:
    """Grant ``count`` consecutive slots, the first no later than ``now + max_wait``."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    start = max(state.tat_us, state.blocked_until_us, now_us)
    if start - now_us > max_wait_us:
        return Wait(start - max_wait_us)
    step = policy.interval_us
    slots = tuple(start + i * step for i in range(count))
    return Granted(slots, attrs.evolve(state, tat_us=start + count * step))


def throttled(state: QuotaState, *, now_us: int, retry_after_us: int) -> QuotaState:
    """A provider 429: nothing starts before ``now + retry_after`` (never moves it back)."""
    return attrs.evolve(state, blocked_until_us=max(state.blocked_until_us,
                                                    now_us + max(0, retry_after_us)))


def returned(policy: QuotaPolicy, state: QuotaState, unused: tuple[int, ...]
             ) -> QuotaState | None:
    """Give back unused slots, when they are the newest ones granted (nothing was granted
    after them); ``None`` when they cannot come back (they simply expire unused, which only
    ever costs throughput, never correctness)."""
    if not unused:
        return None
    step = policy.interval_us
    first = min(unused)
    expected = tuple(first + i * step for i in range(len(unused)))
    if tuple(sorted(unused)) != expected or state.tat_us != first + len(unused) * step:
        return None
    return attrs.evolve(state, tat_us=first)


def slot_usable(policy: QuotaPolicy, slot_us: int, now_us: int) -> bool:
    """A send may start at ``now`` on this slot: not early, not past its jitter."""
    return slot_us <= now_us < slot_us + max(1, policy.jitter_us)


class ReservationState(enum.StrEnum):
    """One slot handed to one effect attempt (seed 9: reserved before dispatch)."""

    RESERVED = "reserved"  # granted to a claim; nothing sent yet
    SENT = "sent"  # the request was dispatched on it (a response, any response)
    RELEASED = "released"  # provably never left (pre-dispatch refusal, connect failure)
    SPENT_UNKNOWN = "spent_unknown"  # it may have left (timeout, reset): counts as spent


# A reservation moves once, out of RESERVED; every other state is terminal.
RESERVATION_TRANSITIONS: frozenset[tuple[ReservationState, ReservationState]] = frozenset({
    (ReservationState.RESERVED, ReservationState.SENT),
    (ReservationState.RESERVED, ReservationState.RELEASED),
    (ReservationState.RESERVED, ReservationState.SPENT_UNKNOWN),
})


def reservation_transition(current: ReservationState, target: ReservationState) -> bool:
    """Whether ``current -> target`` is legal (a repeat of the same move is idempotent)."""
    return current == target or (current, target) in RESERVATION_TRANSITIONS
