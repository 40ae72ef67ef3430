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

Replicas' clocks
----------------
Each replica reads its slots on its own clock, and the slots were placed on the clocks of
whichever replicas granted them. With clocks up to ``clock_spread`` apart, a send that
starts within its jitter on its own clock may arrive up to ``jitter + clock_spread`` after
its slot in real time (relative to another replica's slots). Every spacing rule below
therefore uses that sum (:attr:`QuotaPolicy.arrival_spread_us`) where this text says
``jitter``, while a send may still start only within the jitter itself: the spread is
the schedule's margin, never a late sender's. (Folding the spread into the jitter would
hand it to late senders too, and count it once where it is needed twice.)

A provider 429 with ``Retry-After`` (or a reset time) *blocks* the key until then for
every replica: no slot starts before it. Slots are never borrowed from the future beyond
``max_wait``: work that would have to wait longer is told when to come back, so the
scheduler can run it at exactly that time instead of retrying with backoff.

Bursts
------
Even spacing caps a key at its sustained rate: 100 per 10 s could never send 20 at once.
A policy therefore names its window's *kind*, as the provider defines it (L1):

* ``sliding`` (any interval of length ``window``), up to :data:`SLOT_LOG_MAX` slots per
  window: GCRA of interval ``I = ceil((window + jitter) / N)`` with a burst tolerance
  ``tau = (B - 1)·I`` (up to ``B`` slots start at once), *and* a **slot log**: the row keeps
  an entry for each of the last ``N`` (and a few more) slots, and slot ``n`` may not start
  before the entry of slot ``n - N`` plus ``window + jitter``. An entry is the slot's
  position, or its start if that was later (only a guessed entry can cause that, see
  ``_full_log``), and never less than the entry before it: entries never decrease and
  each is at or after its slot's start. So slot ``n`` starts at least ``window + jitter``
  after every slot up to ``n - N`` started; an arrival is within ``jitter`` of its
  start, so among any ``N + 1`` arrivals the newest slot's is more than ``window`` after
  the oldest's: no window of the provider's own definition sees more than ``N``, exactly,
  whatever the burst. The sustained rate is the even spacing's ``N / (window + jitter)``
  (97.5 % of 100 per 10 s with a 250 ms jitter); the burst comes from idle time (a full
  burst only once the log's ``N``-th newest entry is a window old), not from the
  sustained rate. Positions stay evenly spaced (the log only delays a send within
  ``[p - tau, p]``), so blocks and give-back work as for GCRA; a given-back slot also
  leaves the log (it was never sent), but only while the log still holds ``N`` entries
  after it (else it simply expires).
* ``sliding`` above :data:`SLOT_LOG_MAX` (250,000 per day: a log that long is too big for
  one row): GCRA with the *stretched* interval. With a burst of ``B`` the tolerance is
  ``tau = (B - 1)·I`` and a slot may start up to ``tau``
  before its TAT, so up to ``B`` slots start at once. Any ``m`` consecutive slots then
  satisfy ``s_m - s_1 >= (m - 1)·I - tau``; ``N + 1`` of them in an open interval of
  length ``window + jitter`` would need ``N·I - tau < window + jitter``, so choosing
  ``I = ceil((window + jitter) / (N - B + 1))`` makes that impossible. The price of a
  burst of ``B`` is the sustained rate: ``(N - B + 1) / (window + jitter)``, small when
  ``B`` is small beside ``N`` (1 % for a daily burst of 2,500 of 250,000).
* ``fixed`` (the provider counts per window aligned to ``offset + k·window``, e.g. a day
  from midnight UTC): a counter per window, so all ``N`` may go at once and the next ``N``
  at the next window's start. A slot whose jitter could carry its arrival past the window's
  end is moved to the next window. The row's TAT holds the counted window's start plus the
  number of its slots handed out (one microsecond each: the limit must stay below the
  window in microseconds), so one integer still says everything.

Each slot also has a *position* on that TAT line (``Granted.positions``): the newest slots
of a grant come back by their positions (:func:`returned`), never by their send times
(several slots of a burst share one send time).

Remaining counts
----------------
A provider that reports how many requests remain in its window (an L1 header) corrects
drift (another client on the same app, a restart that lost in-flight slots): when it says
fewer remain than the row would grant, :func:`corrected` moves the TAT forward so at most
that many slots start before new capacity accrues. It never moves the budget backward.

Endpoint classes and reset headers
----------------------------------
A provider may limit a group of its endpoints apart from the rest (a CRM's search
endpoints: a few requests per second per token, beside the app's own limits). L1 names
each operation's *endpoint class*; a dimension may count only some classes
(:attr:`ClassScope.applies_to`) and may give each class a budget of its own (its key then
names the class): :func:`endpoint_class_key` decides which key, if any, a call counts
against. A provider may also say *when* its window resets (a header L1 names, in seconds
until the reset or as an epoch time): :func:`reset_at` reads it, and refuses values that
are malformed, negative, already past or further away than the window could ever be
(:func:`reset_cap_us`), so a bad header never blocks a key for a day nor crashes.
"""

from __future__ import annotations

import enum
import itertools
import math
import re
from collections.abc import Sequence

import attrs

# A sliding window with a burst keeps a slot log up to this many slots per window (the
# log lives in the key's row: SLOT_LOG_MAX + SLOT_LOG_RESERVE numbers); above it the
# stretched GCRA (see "Bursts").
SLOT_LOG_MAX = 1_000
# Entries kept beyond the limit, so the newest slots of a block can come back.
SLOT_LOG_RESERVE = 32



class QuotaPolicyError(ValueError):
    """A quota definition that cannot be enforced (zero or negative limit or window)."""


class WindowKind(enum.StrEnum):
    """How the provider counts its window (L1 declares it)."""

    SLIDING = "sliding"  # any interval of the window's length
    FIXED = "fixed"  # windows aligned to offset + k * window


@attrs.frozen(kw_only=True)
class QuotaPolicy:
    """One quota dimension of one provider (L1), with L2's scope folded into the key."""

    limit: int
    window_us: int
    # How late a send may start within its slot (and how much arrival jitter is absorbed).
    jitter_us: int = 250_000
    # How far apart the replicas' wall clocks may be (``work.clock_spread``): each replica
    # reads its slots on its own clock, so in real time a send may arrive this much later
    # again. The schedule spaces slots for both (:attr:`arrival_spread_us`); a send itself
    # may still start only within the jitter (:func:`slot_usable`).
    clock_spread_us: int = 0
    kind: WindowKind = WindowKind.SLIDING
    # Sliding: how many slots may start at once (1: evenly spaced). Fixed: always `limit`.
    burst: int = 1
    # Fixed: where the provider's windows start (epoch us modulo the window).
    offset_us: int = 0

    def __attrs_post_init__(self) -> None:
        if isinstance(self.limit, bool) or self.limit <= 0:
            raise QuotaPolicyError(f"limit must be a positive integer, got {self.limit}")
        if self.window_us <= 0:
            raise QuotaPolicyError(f"window must be positive, got {self.window_us} us")
        if self.jitter_us < 0:
            raise QuotaPolicyError(f"jitter must not be negative, got {self.jitter_us} us")
        if self.clock_spread_us < 0:
            raise QuotaPolicyError(
                f"clock spread must not be negative, got {self.clock_spread_us} us")
        if isinstance(self.burst, bool) or not 1 <= self.burst <= self.limit:
            raise QuotaPolicyError(
                f"burst must be between 1 and the limit ({self.limit}), got {self.burst}")
        if self.kind is WindowKind.FIXED:
            if self.limit >= self.window_us:
                raise QuotaPolicyError(
                    f"a fixed window's limit must be below its length in us, got {self.limit}")
            if self.arrival_spread_us >= self.window_us:
                raise QuotaPolicyError(
                    "a fixed window must be longer than the jitter and the clock spread")

    @property
    def arrival_spread_us(self) -> int:
        """How long after its slot (on the granting replica's clock) a send may arrive:
        the jitter, plus the replicas' clock spread. Every spacing rule uses this."""
        return self.jitter_us + self.clock_spread_us

    @property
    def uses_slot_log(self) -> bool:
        """A sliding window with a burst, small enough for a slot log in the row."""
        return (self.kind is WindowKind.SLIDING and self.burst > 1
                and self.limit <= SLOT_LOG_MAX)

    @property
    def interval_us(self) -> int:
        """Sliding: the spacing between two slots' positions. Fixed: one position per slot
        (a microsecond of the counted window's TAT)."""
        if self.kind is WindowKind.FIXED:
            return 1
        spread = self.limit if self.uses_slot_log else self.limit - self.burst + 1
        return max(1, math.ceil((self.window_us + self.arrival_spread_us) / spread))

    @property
    def tolerance_us(self) -> int:
        """How far before its position a sliding slot may start (the burst)."""
        if self.kind is WindowKind.FIXED:
            return 0
        return (self.burst - 1) * self.interval_us

    def window_start(self, t_us: int) -> int:
        """Fixed: the start of the provider's window holding ``t``."""
        return t_us - (t_us - self.offset_us) % self.window_us

    def max_sends_in_window(self) -> int:
        """The most sends any window of the provider's own definition can see (<= limit)."""
        if self.kind is WindowKind.FIXED or self.uses_slot_log:
            return self.limit
        # m slots fit in an open interval of length L iff (m-1)·I - tau < L.
        span = self.window_us + self.arrival_spread_us + self.tolerance_us
        return (span - 1) // self.interval_us + 1


@attrs.frozen
class QuotaState:
    """The shared budget row of one quota key."""

    tat_us: int = 0
    # No slot may start before this (a provider 429's Retry-After, for everyone).
    blocked_until_us: int = 0
    # A slot-log policy (QuotaPolicy.uses_slot_log): the positions of the newest slots,
    # oldest first (at least `limit` once anything was granted; empty before).
    log: tuple[int, ...] = ()


@attrs.frozen
class Granted:
    """Send times ``slots`` (each valid until ``slot + jitter``); the row moves to ``state``.

    ``positions`` are the slots' places on the TAT line (what :func:`returned` takes); an
    empty tuple means "the same as the send times" (evenly spaced slots)."""

    slots: tuple[int, ...]
    state: QuotaState
    positions: tuple[int, ...] = ()

    @property
    def places(self) -> tuple[int, ...]:
        return self.positions or self.slots


@attrs.frozen
class Wait:
    """Nothing granted; ``until_us`` is the earliest time a grant of this size can succeed."""

    until_us: int


def grant(policy: QuotaPolicy, state: QuotaState, *, now_us: int, count: int = 1,
          max_wait_us: int = 0) -> Granted | Wait:
    """Grant ``count`` consecutive slots, the first no later than ``now + max_wait``."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    if policy.kind is WindowKind.FIXED:
        return _grant_fixed(policy, state, now_us=now_us, count=count, max_wait_us=max_wait_us)
    if policy.uses_slot_log:
        return _grant_logged(policy, state, now_us=now_us, count=count,
                             max_wait_us=max_wait_us)
    step = policy.interval_us
    tau = policy.tolerance_us
    floor = max(now_us, state.blocked_until_us)
    first = max(floor, state.tat_us - tau)
    if first - now_us > max_wait_us:
        return Wait(first - max_wait_us)
    base = max(state.tat_us, floor)
    positions = tuple(base + i * step for i in range(count))
    slots = tuple(max(floor, p - tau) for p in positions)
    new = attrs.evolve(state, tat_us=base + count * step)
    return Granted(slots, new, () if tau == 0 else positions)


def _full_log(policy: QuotaPolicy, state: QuotaState, floor_us: int) -> list[int]:
    """The log with at least ``limit`` entries. Entries it does not hold are taken as late
    as anything before could have been sent: a new key's as a window before 0 (nothing
    was ever sent),
    else as its oldest entry, or ``max(TAT, now)`` when it has none (a key that ran
    another schedule before, or was only corrected): a guess that can only delay a slot,
    never move it early."""
    log = list(state.log)
    missing = policy.limit - len(log)
    if missing > 0:
        fresh = state.tat_us == 0 and not log
        span = policy.window_us + policy.arrival_spread_us
        pad = -span if fresh else log[0] if log else max(state.tat_us, floor_us)
        log = [pad] * missing + log
    return log


def _grant_logged(policy: QuotaPolicy, state: QuotaState, *, now_us: int, count: int,
                  max_wait_us: int) -> Granted | Wait:
    step = policy.interval_us
    tau = policy.tolerance_us
    span = policy.window_us + policy.arrival_spread_us
    floor = max(now_us, state.blocked_until_us)
    log = _full_log(policy, state, floor)
    first = max(floor, state.tat_us - tau, log[-policy.limit] + span)
    if first - now_us > max_wait_us:
        return Wait(first - max_wait_us)
    base = max(state.tat_us, floor)
    positions = tuple(base + i * step for i in range(count))
    slots = []
    for p in positions:
        # Every entry is at or after its slot's start, so this one starts at least
        # window + jitter after the slot `limit` before it started.
        slot = max(floor, p - tau, log[-policy.limit] + span)
        slots.append(slot)
        # The position, unless a guessed entry pushed the start later (never backward).
        log.append(max(p, slot, log[-1]))
    kept = tuple(log[-(policy.limit + SLOT_LOG_RESERVE):])
    new = attrs.evolve(state, tat_us=base + count * step, log=kept)
    return Granted(tuple(slots), new, positions)


def _grant_fixed(policy: QuotaPolicy, state: QuotaState, *, now_us: int, count: int,
                 max_wait_us: int) -> Granted | Wait:
    if count > policy.limit:
        raise ValueError(f"count {count} exceeds the window's limit {policy.limit}")
    at = max(now_us, state.blocked_until_us)
    start = policy.window_start(at)
    if at + policy.arrival_spread_us > start + policy.window_us:
        # It could arrive in the next window: it counts there, and starts there.
        start += policy.window_us
        at = start
    counted = policy.window_start(state.tat_us)
    if counted > start:  # the row already counts a later window (granted ahead)
        start, at = counted, counted
    used = state.tat_us - start if counted == start else 0
    if used + count > policy.limit:
        start += policy.window_us
        at, used = start, 0
    if at - now_us > max_wait_us:
        return Wait(at - max_wait_us)
    positions = tuple(start + used + i for i in range(count))
    return Granted((at,) * count, attrs.evolve(state, tat_us=start + used + count), positions)


def throttled(state: QuotaState, *, now_us: int, retry_after_us: int) -> QuotaState:
    """A provider 429: nothing starts before ``now + retry_after`` (never moves it back)."""
    return attrs.evolve(state, blocked_until_us=max(state.blocked_until_us,
                                                    now_us + max(0, retry_after_us)))


def returned(policy: QuotaPolicy, state: QuotaState, unused: tuple[int, ...]
             ) -> QuotaState | None:
    """Give back unused slots by their positions (:attr:`Granted.places`), when they are
    the newest ones granted (nothing was granted after them); ``None`` when they cannot
    come back (they simply expire unused, which only ever costs throughput, never
    correctness)."""
    if not unused:
        return None
    step = policy.interval_us
    first = min(unused)
    expected = tuple(first + i * step for i in range(len(unused)))
    if tuple(sorted(unused)) != expected or state.tat_us != first + len(unused) * step:
        return None
    if policy.uses_slot_log:
        # They leave the log too, only while it still holds `limit` entries after them
        # (an entry it no longer holds could not be put back).
        kept = len(state.log) - len(unused)
        if kept < policy.limit or state.log[kept:] != expected:
            return None
        return attrs.evolve(state, tat_us=first, log=state.log[:kept])
    return attrs.evolve(state, tat_us=first)


def corrected(policy: QuotaPolicy, state: QuotaState, *, now_us: int,
              remaining: int) -> QuotaState | None:
    """The provider says ``remaining`` requests are left in its window: the TAT such that
    at most that many slots start before new capacity accrues, or ``None`` when the row
    already grants no more than that (it never moves the budget backward)."""
    remaining = max(0, remaining)
    if policy.kind is WindowKind.FIXED:
        start = policy.window_start(now_us)
        if remaining >= policy.limit:
            return None
        floor = start + policy.limit - remaining
    else:
        if remaining >= policy.burst:
            return None
        # Slots that may start at `now`: those with position - tau <= now.
        floor = now_us + policy.tolerance_us - remaining * policy.interval_us \
            + policy.interval_us
    if state.tat_us >= floor:
        return None
    return attrs.evolve(state, tat_us=floor)


def available(policy: QuotaPolicy, state: QuotaState, *, now_us: int) -> int:
    """How many slots a grant could start at ``now`` (the key's budget, for operators)."""
    if state.blocked_until_us > now_us:
        return 0
    if policy.kind is WindowKind.FIXED:
        start = policy.window_start(now_us)
        if now_us + policy.arrival_spread_us > start + policy.window_us:
            return 0
        counted = policy.window_start(state.tat_us)
        if counted > start:
            return 0
        return policy.limit - (state.tat_us - start if counted == start else 0)
    if policy.uses_slot_log:
        got = _grant_logged(policy, state, now_us=now_us, count=policy.burst, max_wait_us=0)
        return 0 if isinstance(got, Wait) else sum(1 for s in got.slots if s <= now_us)
    if state.tat_us - policy.tolerance_us > now_us:
        return 0
    base = max(state.tat_us, now_us)
    return min(policy.burst, (now_us + policy.tolerance_us - base) // policy.interval_us + 1)


def encode_log(log: tuple[int, ...]) -> str:
    """The slot log as stored: the first position, then each one's distance from the one
    before (positions never decrease), comma-separated decimal."""
    if not log:
        return ""
    return ",".join([str(log[0]), *(str(b - a) for a, b in itertools.pairwise(log))])


def decode_log(text: str | None) -> tuple[int, ...]:
    """:func:`encode_log`'s inverse; a text that is not one raises ``ValueError``."""
    if not text:
        return ()
    out: list[int] = []
    for i, part in enumerate(text.split(",")):
        try:
            value = int(part)
        except ValueError:
            raise ValueError(f"not a slot log: entry {i} is {part[:20]!r}") from None
        if i and value < 0:
            raise ValueError(f"not a slot log: entry {i} goes backward")
        out.append(value if not i else out[-1] + value)
    return tuple(out)


def waiting_turn(cursor_us: int, until_us: int, interval_us: int) -> tuple[int, int]:
    """When a claim that found no slot within its wait should come back, and the next
    cursor: ``(turn, cursor)``. Every claim told "no slot before ``until``" would
    otherwise come back at that same instant, all but a few to be told the same again
    (a herd of claims, grants and deferrals that slows every commit, the checkpoints
    included, until granted slots expire unused). Turns are handed out one slot
    interval apart from the later of ``until`` and the cursor, so the waiters come back
    about as fast as the key can serve them. A turn is only a time to ask again: it
    reserves nothing, so a turn nobody uses costs no capacity."""
    turn = max(until_us, cursor_us)
    return turn, turn + max(1, interval_us)


def send_lead_us(prepare_us: Sequence[int], cap_us: int) -> int:
    """How far ahead of now a claim should ask for its slot: the 90th percentile of the
    recent times from a grant to being ready to send (binding the slot, committing the
    dispatch checkpoint), at most ``cap_us``. A slot granted for "now" expires unused
    whenever that preparation outlasts its jitter; one granted this far ahead is met
    on time. Asking from a later time is still a grant by the schedule's own
    arithmetic: it costs only the lead's latency when the key is idle."""
    if not prepare_us:
        return 0
    ordered = sorted(prepare_us)
    return max(0, min(cap_us, ordered[min(len(ordered) - 1, (len(ordered) * 9) // 10)]))


def slot_usable(policy: QuotaPolicy, slot_us: int, now_us: int) -> bool:
    """A send may start at ``now`` on this slot: not early, not past its jitter (the
    clock spread is the schedule's to absorb, never a late sender's)."""
    return slot_us <= now_us < slot_us + max(1, policy.jitter_us)


@attrs.frozen
class ClassScope:
    """Which endpoint classes a dimension counts (empty: every call, classified or not),
    and which of them count against a budget of their own (``all_apart``: every class)."""

    applies_to: frozenset[str] = frozenset()
    all_apart: bool = False
    apart: frozenset[str] = frozenset()


def endpoint_class_key(base: str, endpoint_class: str, scope: ClassScope) -> str | None:
    """The quota key a call of ``endpoint_class`` ("" : unclassified) counts against for
    a dimension whose key is ``base`` otherwise; ``None`` when the dimension does not
    count that call at all."""
    if scope.applies_to and endpoint_class not in scope.applies_to:
        return None
    if endpoint_class and (scope.all_apart or endpoint_class in scope.apart):
        return f"{base}:class:{endpoint_class}"
    return base


class ResetFormat(enum.StrEnum):
    """How a provider's reset header says when its window resets (L1 declares it)."""

    SECONDS = "seconds"  # seconds from now (as Retry-After's delta-seconds)
    EPOCH_SECONDS = "epoch_seconds"  # a Unix time in seconds
    EPOCH_MS = "epoch_ms"  # a Unix time in milliseconds


class ResetIgnored(enum.StrEnum):
    """Why a reset header's value was not used (counted; the block is left as it was)."""

    MALFORMED = "malformed"  # not a plain decimal number
    NEGATIVE = "negative"
    PAST = "past"  # an epoch time already gone
    BEYOND_CAP = "beyond_cap"  # further away than the provider's window could reset


_DECIMAL = re.compile(r"(-?)([0-9]{1,19})(?:\.([0-9]{1,6}))?")


def reset_cap_us(policy: QuotaPolicy) -> int:
    """The furthest a reset can sanely be: one window (plus the jitter and the header's
    one-second resolution) from now."""
    return policy.window_us + policy.jitter_us + 1_000_000


def reset_at(text: str | None, fmt: ResetFormat, *, now_us: int,
             cap_us: int) -> int | ResetIgnored | None:
    """When the provider's window resets (epoch us), from its header's text; ``None``
    when there is no header, a :class:`ResetIgnored` reason when the value is unusable."""
    if text is None:
        return None
    found = _DECIMAL.fullmatch(text.strip())
    if found is None:
        return ResetIgnored.MALFORMED
    sign, whole, fraction = found.groups()
    if sign and (int(whole) or int(fraction or "0")):
        return ResetIgnored.NEGATIVE
    micro = int(whole) * 1_000_000 + int((fraction or "").ljust(6, "0"))  # value * 10^6
    if fmt is ResetFormat.SECONDS:
        at = now_us + micro
    elif fmt is ResetFormat.EPOCH_SECONDS:
        at = micro
    else:
        at = micro // 1000
    if at < now_us:
        return ResetIgnored.PAST
    if at - now_us > cap_us:
        return ResetIgnored.BEYOND_CAP
    return at


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
