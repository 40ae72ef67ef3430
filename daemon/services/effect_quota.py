"""Provider quota, reserved before dispatch (seed 9).

Theory of operation
-------------------
Every quota dimension the pinned operation's L1 definition declares (``[quota.<name>]``:
``limit`` per ``window``, counted per app installation or per binding) is one shared
quota key, ``<provider>:<dimension>:<org>:<scope value>``. Before the dispatch
checkpoint, :func:`reserve` takes one send slot of each key from the shared ledger
(:meth:`storage.quota.QuotaLedger.quota_reserve`: under the claim's live fence, one
conditional UPDATE per grant, and the reservation binding it to this claim
(``quota_reservations``: ``reserved``), all in one transaction: a stale claimant moves
no budget). When a key has no slot within ``max_wait`` the work is told the exact time
one will be free (:class:`QuotaWait`), and slots already taken for other keys are given
back (fenced). A claim lost before it settles its slots leaves them to the quota sweep
(:func:`return_lost_slots`, :mod:`daemon.core.lost_slots`).

The runner checkpoints, then waits for the latest slot and checks every slot again (a
slot whose jitter has passed by then is not sent on: the attempt is recorded as not
sent and its slots come back), sends,
and :func:`settle_reservations` moves each reservation with the attempt it was used by:
``sent`` (a response came), ``released`` (provably never left: capacity comes back) or
``spent_unknown`` (a timeout or reset counts as spent). A provider 429 moves every key's
budget forward for all replicas (:func:`throttle_429`: its Retry-After, else the reset
header L1 names, else the operation's default), and so does a 2xx saying none remain
(:func:`block_exhausted`, until the reset). A dimension limited to some endpoint classes
counts only their calls, and one with a budget per class has a key per class.

Waiting never costs an attempt: a key with no slot within ``max_wait`` defers the claim
(:class:`QuotaWait`), and a slot that expires while the request waits on our side (for a
connection, the checkpoint, the event loop) holds it back unsent (``Phase.HELD``), and
the claim is requeued uncharged. :class:`QuotaHints` keeps one process from stampeding a
hot key's row (one grant at a time, the ledger's last "no slot before then", turns one
interval apart for the claims it turns away) and asks for each slot as far ahead as its
preparation takes; they are hints: only the ledger grants.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping

import attrs
import trio

from config.definitions import OperationDefinition, policy_of
from config.settings import BindingSettings
from daemon.core.effects import DispatchObservation, Phase
from daemon.core.lost_slots import LostSlot, SendGate
from daemon.core.quota import (
    QuotaPolicy,
    ReservationState,
    ResetFormat,
    ResetIgnored,
    Wait,
    endpoint_class_key,
    reset_at,
    reset_cap_us,
    send_lead_us,
    slot_usable,
    waiting_turn,
)
from daemon.core.work import Fence
from daemon.services import logs
from daemon.services.clock import Clock
from storage.port import SqlTx
from storage.quota import LostSlotSettled, SlotRelease, reservation_move
from storage.work_store import WorkStore

# How long a claim may wait for its slot before it is rescheduled for later instead.
MAX_WAIT_US = 1_000_000
# How far ahead a claim asks for its slot at most: the time it needs to be ready to send
# (bind, checkpoint; QuotaHints.lead_us). Spent preparing, not waiting.
MAX_LEAD_US = 2_000_000


@attrs.frozen
class QuotaKey:
    key: str
    policy: QuotaPolicy
    dimension: str = ""
    # The response header with the provider's own remaining count (L1), if any.
    remaining_header: str = ""
    # The response header saying when the provider's window resets, and its format.
    reset_header: str = ""
    reset_format: ResetFormat = ResetFormat.SECONDS


@attrs.frozen
class Reserved:
    key: QuotaKey
    slot_us: int
    reservation_id: str
    # Its place on the key's TAT line (what comes back when it is not used).
    position_us: int
    # When this process asked the ledger for it (its clock, before the grant's own
    # transaction): the preparation is measured from here (QuotaHints.prepared), so the
    # lead covers the fenced grant's latency too (queued on the key's row under load, it
    # took as long as the checkpoint after it: slots asked "lead ahead" arrived already
    # due, and most expired before their checkpoint committed).
    asked_at_us: int = 0


@attrs.frozen
class QuotaWait:
    """No slot now: the earliest time every key can grant one."""

    key: str
    until_us: int
    # The key's slot interval (how fast it serves waiters; 0: unknown).
    interval_us: int = 0


@attrs.define
class QuotaHints:
    """This process's admission hints for its hot quota keys (the seed allows process-
    local hints; the ledger stays the only authority and still grants every slot):

    * one grant at a time per set of keys from this process: hundreds of claims of one
      key asking the ledger at once queue on its one row, and every grant (and with
      it the bind and the checkpoint) then waits behind all of them, until the slots
      granted expire before they can be used: no send at all for seconds while work
      waits (a congestion collapse, measured with ``bench.effects --provider-limit``);
    * what the ledger last said: once it answered "no slot within the wait before
      ``until``", a claim of that key before then is told so without asking again;
    * turns (:func:`daemon.core.quota.waiting_turn`): the claims given back come back
      one slot interval apart instead of all at once."""

    _cursors: dict[str, int] = attrs.field(factory=dict)
    _no_slot: dict[str, QuotaWait] = attrs.field(factory=dict)
    _asking: dict[tuple[str, ...], trio.Lock] = attrs.field(factory=dict)
    # The recent preparation times, ask to ready (see lead_us).
    _prepare_us: collections.deque[int] = attrs.field(
        factory=lambda: collections.deque(maxlen=64))

    def prepared(self, reserved: list[Reserved], ready_us: int) -> None:
        """A claim is ready to send on ``reserved`` at ``ready_us`` (its preparation:
        from asking the ledger to a committed checkpoint)."""
        if reserved:
            self._prepare_us.append(max(0, ready_us - min(r.asked_at_us for r in reserved)))

    def lead_us(self) -> int:
        """How far ahead to ask for a slot (:func:`daemon.core.quota.send_lead_us`)."""
        return send_lead_us(self._prepare_us, MAX_LEAD_US)

    def turn(self, wait: QuotaWait) -> int:
        at, self._cursors[wait.key] = waiting_turn(self._cursors.get(wait.key, 0),
                                                   wait.until_us, wait.interval_us)
        return at

    def known_wait(self, keys: list[QuotaKey], now_us: int) -> QuotaWait | None:
        """The ledger's last "no slot before then" for one of ``keys``, still in force."""
        for k in keys:
            wait = self._no_slot.get(k.key)
            if wait is not None and now_us < wait.until_us:
                return wait
        return None

    def learn(self, wait: QuotaWait) -> None:
        self._no_slot[wait.key] = wait

    def asking(self, keys: list[QuotaKey]) -> trio.Lock:
        return self._asking.setdefault(tuple(sorted(k.key for k in keys)), trio.Lock())


_WAITING = re.compile(r"quota key (\S+) has no send slot")


def waiting_summary(key: str, delay_s: float) -> str:
    """The operator summary of work rescheduled for ``key`` (read back by the gauges)."""
    return f"quota key {key} has no send slot for {delay_s:.3f} s; scheduled for then"


def waiting_key(summary: str) -> str | None:
    """The quota key a ``quota_wait`` summary names (None: not one of ours)."""
    found = _WAITING.match(summary)
    return found.group(1) if found else None


def declared_keys(operations: Iterable[OperationDefinition],
                  bindings: Iterable[BindingSettings], *, clock_spread_us: int
                  ) -> dict[str, QuotaKey]:
    """Every quota key the Catalog's operations and bindings can count against."""
    out: dict[str, QuotaKey] = {}
    ops = list(operations)
    for b in bindings:
        for op in ops:
            if op.provider == b.provider:
                out.update((k.key, k) for k in quota_keys(op, b,
                                                          clock_spread_us=clock_spread_us))
    return out


def quota_keys(op: OperationDefinition, binding: BindingSettings, *,
               clock_spread_us: int) -> list[QuotaKey]:
    """One key per L1 dimension that counts this operation's endpoint class, against the
    scope L2 names for it (or L1's); a dimension with a budget per endpoint class (L1's
    ``per_endpoint_class``, or the classes L2 names) has the class in its key. Each key's
    schedule is spaced for replicas' clocks up to ``clock_spread_us`` apart."""
    out = []
    for q in op.quotas:
        override = binding.quota_scope(q.name)
        scope = override.scope if override is not None and override.scope else q.scope
        if scope == "provider_key":
            assert override is not None
            base = f"{op.provider}:{q.name}:key:{override.key}"
        else:
            value = {"app_installation": binding.app_installation_id,
                     "binding": binding.binding_id, "org": binding.org_id}[scope]
            base = f"{op.provider}:{q.name}:{binding.org_id}:{value}" if scope != "org" \
                else f"{op.provider}:{q.name}:{binding.org_id}"
        apart = frozenset(override.endpoint_classes) if override is not None else frozenset()
        name = endpoint_class_key(base, op.endpoint_class, q.class_scope(apart))
        if name is None:
            continue  # the dimension does not count this endpoint class
        out.append(QuotaKey(name, policy_of(q, clock_spread_us), q.name, q.remaining_header,
                            q.reset_header,
                            ResetFormat(q.reset_format or ResetFormat.SECONDS)))
    return out


async def reserve(store: WorkStore, clock: Clock, fence: Fence,
                  keys: list[QuotaKey], hints: QuotaHints | None = None, *,
                  read: bool = False) -> list[Reserved] | QuotaWait:
    """One slot of every key, bound to this claim as it is granted (one fenced
    transaction per slot: a stale claimant moves no budget, ``LostLease``), or when to
    come back. ``read``: the slots are a provider read's, which sends with no dispatch
    checkpoint, so they are marked handed out (fenced) before they are returned; an
    effect's slots are gated by its checkpoint instead (:mod:`daemon.core.lost_slots`).
    With ``hints``, this process asks the ledger once at a time per set of keys, and
    not at all while its last answer ("no slot before then") holds."""
    if not keys:
        return []
    gate = SendGate.GRANTED if read else SendGate.CHECKPOINT
    if hints is None:
        now = clock.now_us()
        granted = await _common_instant(store, clock, fence, keys, now, gate)
    else:
        async with hints.asking(keys):
            now = clock.now_us()
            known = hints.known_wait(keys, now)
            if known is not None:
                return known
            granted = await _common_instant(store, clock, fence, keys, now, gate,
                                            hints.lead_us())
            if isinstance(granted, QuotaWait):
                hints.learn(granted)
    if isinstance(granted, QuotaWait):
        return granted
    # ``now``: the time the lead was added to (after this process's turn to ask).
    return await _usable(store, clock, fence,
                         [attrs.evolve(r, asked_at_us=now) for r in granted], hints, read=read)


async def _usable(store: WorkStore, clock: Clock, fence: Fence, granted: list[Reserved],
                  hints: QuotaHints | None, *, read: bool) -> list[Reserved] | QuotaWait:
    """``granted`` as :func:`reserve` returns it: given back when one is already too late
    to send on, a read's slots handed out."""
    at = clock.now_us()
    if at >= min(r.slot_us + max(1, r.key.policy.jitter_us) for r in granted):
        # Too late for one of them already: nothing is sent on it, and it may come back.
        if hints is not None:
            # The grant alone took this long: the lead must cover at least that much
            # (else a lead learnt only from claims that reached their checkpoint stays
            # short for good, and every slot asked with it comes back already due).
            hints.prepared(granted, at)
        await _release(store, fence, granted, clock.now_us)
        return QuotaWait(granted[0].key.key, at)
    if read:
        await store.quota_hand_out(fence, [r.reservation_id for r in granted],
                                   now=clock.now_us)
    return granted


def slot_wait_us(reserved: list[Reserved], now_us: int) -> int:
    """How long until every slot may start (the runner waits after its checkpoint)."""
    return max([0, *(r.slot_us - now_us for r in reserved)])


# Sleeps toward the latest slot before a claim gives up waking early (see wait_for_slots).
_WAKES = 4


async def wait_for_slots(clock: Clock, reserved: list[Reserved]) -> bool:
    """Sleep until the latest slot; True when every slot may still start a send then.
    trio's timer and the replica's clock are two clocks: a sleep may end a moment
    before the slot by the replica's clock (a truncating conversion to microseconds, a
    wall clock slewed behind the monotonic one). That is no reason to hold the send
    back and lose the slot: the claim sleeps again for what is left."""
    for _ in range(_WAKES):
        delay = slot_wait_us(reserved, clock.now_us())
        if delay <= 0:
            break
        await trio.sleep(delay / 1_000_000)
    return still_usable(reserved, clock.now_us())


# Rounds of "ask every key for a slot at or after the latest one so far" before giving up.
_ROUNDS = 4


async def _common_instant(store: WorkStore, clock: Clock, fence: Fence, keys: list[QuotaKey],
                          now: int, gate: SendGate, lead_us: int = 0
                          ) -> list[Reserved] | QuotaWait:
    """One slot of every key such that some instant lies within all of them: a key with
    a burst may grant one for now while another's is later, and a slot is only valid for
    its jitter, so a later slot makes the earlier ones ask again from its time (the
    early ones are given back). A grant "from" a later time is still a grant by the
    schedule's own arithmetic (never more than the limit in any window), and so is one
    asked ``lead_us`` ahead (the time this process needs to be ready to send on it).
    ``now`` is the clock's reading the slots are asked from; each reservation's fence is
    judged by ``clock`` read inside its own transaction."""
    lead = max(0, min(lead_us, MAX_LEAD_US))
    target = now + lead
    # The claim may wait MAX_WAIT_US in process beyond its preparation (the lead).
    horizon = target + MAX_WAIT_US
    # The slowest key first: its slot is usually the latest, and every later key is asked
    # from it, so one round normally suffices (a round that fails costs slots that may
    # not come back: under contention someone has been granted after them).
    ordered = sorted(keys, key=lambda k: -k.policy.interval_us)
    for _ in range(_ROUNDS):
        granted: list[Reserved] = []
        for k in ordered:
            got = await store.quota_reserve(k.key, k.policy, fence=fence, gate=gate,
                                            now=clock.now_us, from_us=target,
                                            max_wait_us=max(0, horizon - target))
            if isinstance(got, Wait):
                await _release(store, fence, granted, clock.now_us)
                return QuotaWait(k.key, got.until_us - (target - now), k.policy.interval_us)
            granted.append(Reserved(k, got.slot_us, got.reservation_id, got.position_us))
            target = max(target, got.slot_us)
        latest = max(r.slot_us for r in granted)
        if all(latest < r.slot_us + max(1, r.key.policy.jitter_us) for r in granted):
            return granted
        await _release(store, fence, granted, clock.now_us)
        target = latest
    return QuotaWait(keys[0].key, target)


async def _release(store: WorkStore, fence: Fence, reserved: list[Reserved],
                   now: Callable[[], int]) -> None:
    """Give back slots this live claim reserved and will not send on (fenced: a claim
    lost meanwhile leaves them to the quota sweep, ``LostLease``)."""
    if reserved:
        await store.quota_release(fence, [
            SlotRelease(r.reservation_id, r.key.key, r.key.policy, r.position_us)
            for r in reserved], now=now)


async def _give_back(store: WorkStore, granted: list[tuple[QuotaKey, int, int]],
                     now: int) -> None:
    for k, _, place in granted:
        await store.quota_return(k.key, k.policy, (place,), now_us=now)


async def _move(store: WorkStore, fence: Fence, ids: list[str], target: ReservationState,
                attempt_id: str | None, now: Callable[[], int]) -> None:
    async def body(tx: SqlTx) -> None:
        at = now()
        for rid in ids:
            await reservation_move(tx, rid, target, now_us=at, attempt_id=attempt_id)

    await store.work_fenced(fence, now, body, name="quota.release")


async def move_reservations(store: WorkStore, fence: Fence, reserved: list[Reserved],
                            target: ReservationState, now: Callable[[], int]) -> None:
    """Settle reservations that no effect attempt used (a provider read's), fenced (the
    fence judged at ``now`` read inside the transaction)."""
    await _move(store, fence, [r.reservation_id for r in reserved], target, None, now)


def still_usable(reserved: list[Reserved], now_us: int) -> bool:
    """Every slot may still start a send at ``now`` (re-checked after the checkpoint)."""
    return all(slot_usable(r.key.policy, r.slot_us, now_us) for r in reserved)


def outcome_state(seen: DispatchObservation) -> ReservationState:
    """What the exchange did with the slot: only a request held back or a refused
    connect provably never left."""
    if seen.phase in (Phase.HELD, Phase.NOT_CONNECTED):
        return ReservationState.RELEASED
    if seen.phase is Phase.SENT:
        return ReservationState.SPENT_UNKNOWN
    return ReservationState.SENT


def settle_reservations(reserved: list[Reserved], seen: DispatchObservation,
                        attempt_id: str, now_us: int) -> Callable[[SqlTx], Awaitable[None]]:
    """The finalization write: each reservation with the attempt that used it."""
    target = outcome_state(seen)

    async def write(tx: SqlTx) -> None:
        for r in reserved:
            await reservation_move(tx, r.reservation_id, target, now_us=now_us,
                                   attempt_id=attempt_id)

    return write


async def give_back_unsent(store: WorkStore, reserved: list[Reserved],
                           seen: DispatchObservation, now_us: int) -> bool:
    """Capacity comes back only when the attempt provably never left (True: it did)."""
    if outcome_state(seen) is not ReservationState.RELEASED:
        return False
    await _give_back(store, [(r.key, r.slot_us, r.position_us) for r in reserved], now_us)
    return True


async def release_unused(store: WorkStore, fence: Fence, reserved: list[Reserved],
                         now: Callable[[], int]) -> None:
    """Slots reserved for an attempt its checkpoint refused (nothing was written, nothing
    left): the reservations are released under the claim's fence and the capacity comes
    back."""
    await _release(store, fence, reserved, now)


def _lowered(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _reset(r: Reserved, headers: Mapping[str, str], now_us: int
           ) -> int | ResetIgnored | None:
    if not r.key.reset_header:
        return None
    return reset_at(headers.get(r.key.reset_header), r.key.reset_format, now_us=now_us,
                    cap_us=reset_cap_us(r.key.policy))


async def settle_after_dispatch(
    store: WorkStore, reserved: list[Reserved], seen: DispatchObservation, attempt_id: str, *,
    default_retry_after_s: float, now_us: int,
    on_finalize: Callable[[Callable[[SqlTx], Awaitable[None]]], None],
    on_quota: Callable[[str], None], on_ignored: Callable[[str], None],
) -> float | None:
    """What every provider call does with its slots once the exchange is over (effects and
    subscription calls alike): the reservations move with the attempt at the
    finalization, unsent slots come back, the provider's counts correct the ledger, a 429
    blocks every key for every replica, and a 2xx saying none remain blocks them until
    the provider's reset. Returns the delay a 429 was given (its Retry-After, else the
    reset header L1 names; None without a 429 or a usable reset)."""
    on_finalize(settle_reservations(reserved, seen, attempt_id, now_us))
    if await give_back_unsent(store, reserved, seen, now_us):
        on_quota("given_back")
    headers = dict(seen.quota_headers)
    if headers and await correct(store, reserved, headers, now_us):
        on_quota("corrected")
    if seen.status == 429:
        on_quota("throttled")
        return await throttle_429(store, reserved, seen.retry_after_s, default_retry_after_s,
                                  headers, now_us, on_ignored)
    if seen.status is not None and 200 <= seen.status < 300 and headers and \
            await block_exhausted(store, reserved, headers, now_us, on_ignored):
        on_quota("exhausted")
    return None


async def throttle_429(store: WorkStore, reserved: list[Reserved],
                       retry_after_s: float | None, default_s: float,
                       headers: Mapping[str, str], now_us: int,
                       on_ignored: Callable[[str], None] = lambda reason: None
                       ) -> float | None:
    """A provider 429 blocks every key this call counted against, for every replica, in
    one statement per key: until its ``Retry-After`` when it sent one; otherwise until
    the reset its L1 reset header names (a value that is malformed, negative, past or
    beyond the window is ignored and counted) or, failing both, the operation's default.
    The block never moves backward (:func:`daemon.core.quota.throttled`). Returns the
    latest delay (seconds) a reset header set, if any: when the work may try again."""
    lowered = _lowered(headers)
    latest: int | None = None
    for r in reserved:
        delay_us = int((retry_after_s if retry_after_s is not None else default_s)
                       * 1_000_000)
        if retry_after_s is None:
            at = _reset(r, lowered, now_us)
            if isinstance(at, ResetIgnored):
                on_ignored(at.value)
            elif at is not None:
                delay_us = at - now_us
                latest = max(latest or 0, delay_us)
        await store.quota_throttle(r.key.key, r.key.policy, now_us=now_us,
                                   retry_after_us=delay_us)
    return None if latest is None else latest / 1_000_000


async def block_exhausted(store: WorkStore, reserved: list[Reserved],
                          headers: Mapping[str, str], now_us: int,
                          on_ignored: Callable[[str], None] = lambda reason: None) -> int:
    """A 2xx whose remaining count (L1's header) is 0: each such key is blocked until
    the reset its L1 reset header names, for every replica (never moved backward).
    Returns how many keys were blocked."""
    lowered = _lowered(headers)
    blocked = 0
    for r in reserved:
        text = lowered.get(r.key.remaining_header) if r.key.remaining_header else None
        if text is None or text.strip() != "0":
            continue
        at = _reset(r, lowered, now_us)
        if isinstance(at, ResetIgnored):
            on_ignored(at.value)
        elif at is not None and at > now_us:
            await store.quota_throttle(r.key.key, r.key.policy, now_us=now_us,
                                       retry_after_us=at - now_us, is_429=False)
            blocked += 1
    return blocked


async def correct(store: WorkStore, reserved: list[Reserved], headers: Mapping[str, str],
                  now_us: int) -> int:
    """The provider's remaining counts, from the response headers L1 names: each key it
    says has fewer left than its row would grant moves forward for every replica (never
    back). Returns how many keys moved. A header that is not a whole number is ignored."""
    lowered = {k.lower(): v for k, v in headers.items()}
    moved = 0
    for r in reserved:
        text = lowered.get(r.key.remaining_header) if r.key.remaining_header else None
        if text is None or not text.strip().isdigit():
            continue
        if await store.quota_correct(r.key.key, r.key.policy, now_us=now_us,
                                     remaining=int(text.strip())):
            moved += 1
    return moved


# The quota event each settled lost slot counts as (integrationd_quota_events_total).
LOST_SLOT_EVENTS = {LostSlot.REFUND: "lost_refunded", LostSlot.SPEND: "lost_spent"}


async def return_lost_slots(store: WorkStore, declared: Mapping[str, QuotaKey], *,
                            now_us: int, clock_spread_us: int) -> list[LostSlotSettled]:
    """The quota sweep (each replica's depth loop): a lost claim's reservations, once
    their in-flight window has passed, refunded when no request can have left on them,
    else spent (:mod:`daemon.core.lost_slots`). Returns what it settled (logged)."""
    margin = max([clock_spread_us, *(k.policy.clock_spread_us for k in declared.values())])
    settled = await store.quota_return_lost(
        {name: k.policy for name, k in declared.items()}, now_us=now_us, margin_us=margin)
    for s in settled:
        logs.event("quota_lost_slot_settled", quota_key=s.quota_key, work_id=s.work_id,
                   epoch=s.ownership_epoch, decision=s.decision.value, returned=s.returned)
    return settled
