"""Provider reads take quota like effects (seed 9; issue 9 item 5, issue 10).

The inbound Flow's hydration GET and cursor reconciliation's list pages call the provider
outside any effect. Each one is counted against the same shared quota keys as the
binding's effects (:func:`read_keys`: the provider's L1 dimensions, scoped by L2 as for
its operations), through the same reservation:

1. :func:`daemon.services.effect_quota.reserve`: one slot of every key from the shared
   ledger (one conditional statement per grant) bound to this claim in the same fenced
   transaction (a ``quota_reservations`` record, ``reserved``), then marked handed out
   (a read sends with no checkpoint, so a lost claim's handed-out slot counts as spent);
   no slot within
   ``MAX_WAIT_US``: the item is deferred to the exact time the ledger names
   (:class:`~daemon.core.outcomes.Deferred`: not a failure, no attempt charged);
2. wait for the slot; one that expired meanwhile is not sent on (given back, deferred);
3. the request; then each reservation moves with what happened: ``released`` (the
   connection was refused: provably never sent; the capacity comes back), ``sent`` (a
   response came) or ``spent_unknown`` (a timeout or reset: counted as spent);
4. the provider's remaining-count header corrects drift; a 429 moves every key's budget
   forward for all replicas (``Retry-After`` or the L1 default) and the item is deferred
   to that time (never a retry storm, never a burned attempt).

A read has no effect attempt: its reservations carry none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import attrs
import httpx

from config.definitions import OperationDefinition
from config.settings import BindingSettings
from daemon.core.effects import DispatchObservation, Phase
from daemon.core.outcomes import Deferred
from daemon.core.quota import ReservationState
from daemon.providers.executor import NOT_SENT, Answer, retry_after_seconds
from daemon.services import effect_quota as quota
from daemon.services.families import WorkContext

# A read's 429 without Retry-After: come back after this long (seconds).
DEFAULT_RETRY_AFTER_S = 10.0


@attrs.frozen
class ReadQuota:
    """The keys one binding's provider reads count against."""

    keys: tuple[quota.QuotaKey, ...]
    default_retry_after_s: float = DEFAULT_RETRY_AFTER_S
    # Called with a quota event (reserved, waited, throttled, given_back, corrected,
    # exhausted), and with the reason a reset header's value was not used.
    on_quota: Callable[[str], None] = lambda event: None
    on_reset_ignored: Callable[[str], None] = lambda reason: None


def read_keys(operations: Iterable[OperationDefinition], binding: BindingSettings, *,
              clock_spread_us: int) -> tuple[tuple[quota.QuotaKey, ...], float]:
    """The binding's provider's quota keys (every operation of a provider carries its
    L1 dimensions; the same keys its effects use) and its default Retry-After. A read
    has no endpoint class: it counts against the dimensions that count every call, not
    those limited to (or split by) an operation's class."""
    op = next((o for o in operations if o.provider == binding.provider), None)
    if op is None:
        return (), DEFAULT_RETRY_AFTER_S
    unclassified = attrs.evolve(op, endpoint_class="")
    keys = quota.quota_keys(unclassified, binding, clock_spread_us=clock_spread_us)
    return tuple(keys), op.contract.default_retry_after_s


def _state(phase: Phase) -> ReservationState:
    return quota.outcome_state(DispatchObservation(phase))


async def quota_read(ctx: WorkContext, rq: ReadQuota,
                     call: Callable[[], Awaitable[Answer]]
                     ) -> Answer | Deferred:
    """``call`` (one provider read) on one slot of every key; ``Deferred`` when the
    budget has none now (or the provider said 429). ``httpx.HTTPError`` propagates after
    the reservations are settled."""
    keys = list(rq.keys)
    if not keys:
        return await call()
    reserved = await quota.reserve(ctx.store, ctx.clock, ctx.fence, keys, read=True)
    if isinstance(reserved, quota.QuotaWait):
        rq.on_quota("waited")
        delay = max(0.0, (reserved.until_us - ctx.clock.now_us()) / 1_000_000)
        return Deferred("quota_wait", reserved.until_us,
                        quota.waiting_summary(reserved.key, delay))
    rq.on_quota("reserved")
    if not await quota.wait_for_slots(ctx.clock, reserved):
        # The slot's jitter passed before the send could start: nothing leaves.
        now = ctx.clock.now_us()
        await _settle(ctx, reserved, ReservationState.RELEASED)
        await quota.give_back_unsent(
            ctx.store, reserved, DispatchObservation(Phase.NOT_CONNECTED), now)
        rq.on_quota("given_back")
        return Deferred("quota_wait", now, quota.waiting_summary(reserved[0].key.key, 0.0))
    try:
        response = await call()
    except NOT_SENT:
        now = ctx.clock.now_us()
        await _settle(ctx, reserved, ReservationState.RELEASED)
        await quota.give_back_unsent(
            ctx.store, reserved, DispatchObservation(Phase.NOT_CONNECTED), now)
        rq.on_quota("given_back")
        raise
    except httpx.HTTPError:
        await _settle(ctx, reserved, _state(Phase.SENT))
        raise
    now = ctx.clock.now_us()
    await _settle(ctx, reserved, _state(Phase.RESPONDED))
    if await quota.correct(ctx.store, reserved, dict(response.headers), now):
        rq.on_quota("corrected")
    headers = dict(response.headers)
    if response.status_code == 429:
        rq.on_quota("throttled")
        # As for effects: its Retry-After; without one, the reset header L1 names (a bad
        # value ignored and counted); else the default. One statement per key.
        after = retry_after_seconds(response.headers.get("retry-after"))
        reset_s = await quota.throttle_429(ctx.store, reserved, after,
                                           rq.default_retry_after_s, headers, now,
                                           rq.on_reset_ignored)
        after_s = after if after is not None else (
            reset_s if reset_s is not None else rq.default_retry_after_s)
        until = now + int(after_s * 1_000_000)
        return Deferred("quota_throttled", until, quota.waiting_summary(
            reserved[0].key.key, after_s))
    if 200 <= response.status_code < 300 and await quota.block_exhausted(
            ctx.store, reserved, headers, now, rq.on_reset_ignored):
        rq.on_quota("exhausted")
    return response


async def _settle(ctx: WorkContext, reserved: list[quota.Reserved],
                  target: ReservationState) -> None:
    await quota.move_reservations(ctx.store, ctx.fence, reserved, target, ctx.clock.now_us)
