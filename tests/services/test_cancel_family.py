"""Families declare what cancel means; a step refused because of a cancel request ends
the handler with the fenced acknowledgement (issue 8 item 7), on real storage."""

from __future__ import annotations

import attrs

from config.settings import Settings
from daemon.core.cancel import CancelRule
from daemon.core.outcomes import CancelAcknowledged, Outcome, Succeeded
from daemon.core.states import WorkState
from daemon.services.families import WorkContext, build_registry
from storage.port import CancelParams
from storage.work_store import WorkStore
from tests.support.commands import accept_pinned, attempt, draft
from tests.support.work import T0, claim, finalization


@attrs.frozen
class FixedClock:
    at_us: int

    def now_us(self) -> int:
        return self.at_us


async def test_each_built_in_family_declares_its_cancel_rule() -> None:
    async def nothing(ctx: WorkContext) -> Outcome:
        return Succeeded()

    registry = build_registry(Settings(), {"noop": nothing, "external_effect": nothing,
                                           "runtime_receipt": nothing, "other": nothing})
    # inbound_apply and cursor_reconcile stop anytime: a Runtime mutation is replay-safe by
    # its key, and a run only reads and queues items. A subscription step's provider call
    # cannot be called back once dispatched, as an external effect's.
    inbound = {"inbound_apply": CancelRule.ANYTIME, "cursor_reconcile": CancelRule.ANYTIME,
               "subscription_reconcile": CancelRule.BEFORE_DISPATCH}
    assert registry.cancel_rules() == {
        "noop": CancelRule.ANYTIME, "external_effect": CancelRule.BEFORE_DISPATCH,
        "runtime_receipt": CancelRule.NEVER, "other": CancelRule.ANYTIME, **inbound}
    # A registry that runs only noop (the CLI's) still knows the others' rules.
    assert build_registry(Settings()).cancel_rules() == {
        "noop": CancelRule.ANYTIME, "external_effect": CancelRule.BEFORE_DISPATCH,
        "runtime_receipt": CancelRule.NEVER, **inbound}


async def test_a_cancel_requested_before_the_checkpoint_is_acknowledged(
    store: WorkStore,
) -> None:
    accepted = await accept_pinned(store, draft(), T0)
    command_id = str(accepted.command_id)
    (item,) = (await claim(store, family="external_effect")).claimed
    assert item.fence is not None
    sent: list[str] = []

    async def dispatching(ctx: WorkContext) -> Outcome:
        await ctx.store.effect_checkpoint(ctx.fence, attempt(command_id), lambda: T0)
        sent.append("PATCH")  # only after the checkpoint committed
        return Succeeded()

    registry = build_registry(Settings(), {"external_effect": dispatching})
    result = await store.work_cancel_audited(
        CancelParams(work_id=item.work_id, actor="otto", role="operator", reason="stop"),
        T0, registry.cancel_rules())
    assert result.disposition == "requested"
    ctx = WorkContext(item=item, fence=item.fence, store=store, clock=FixedClock(T0),
                      replica_id="r")
    outcome = await registry.get("external_effect").handler(ctx)
    assert outcome == CancelAcknowledged()
    assert sent == [] and await store.effect_attempts(command_id) == []
    (done,) = await store.work_finalize_if_owner([finalization(item, outcome)], "r", lambda: T0)
    assert done.applied and done.state is WorkState.CANCELLED
