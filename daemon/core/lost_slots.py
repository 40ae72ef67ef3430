"""What becomes of a quota slot whose claim was lost before it was settled (issue 20 item
6; seed 5.1, 9): pure decisions, no I/O.

A reservation binds one granted slot to one claim (work id + ownership epoch) and stays
``reserved`` until that claim settles it. A claim lost in between (reclaimed by another
replica, or finished without settling) leaves it ``reserved``; the quota sweep decides:

* **keep** while the claim is live (it settles its own slots) or the slot's in-flight
  window has not passed (``expires_at + clock spread``: until then a request may still
  start on it, and a given-back slot handed to someone else would put two sends in it);
* **spend** (``spent_unknown``, never given back) when a request may have left on it:
  an effect's claim that wrote its dispatch checkpoint, a read that was handed the slot
  (reads send with no checkpoint), or a row whose gate is unknown (the previous build);
* **refund** (``released``, and given back by its position when nothing was granted
  after it) when no request can have left: an effect's claim that never checkpointed
  (the checkpoint is fenced, so a lost claim never will), or a read's slot that
  :func:`daemon.services.effect_quota.reserve` never handed out.

"Never earlier, never twice": a slot is given back only after its window and only by
the one compare-and-swap that moves its reservation out of ``reserved``.
"""

from __future__ import annotations

import enum

import attrs


class SendGate(enum.StrEnum):
    """What lets a request leave on a reserved slot."""

    CHECKPOINT = "checkpoint"  # an effect: only a dispatch checkpoint of this claim
    GRANTED = "granted"  # a read's slot, not yet handed out by reserve
    HANDED = "handed"  # handed to a read, which sends with no checkpoint


class LostSlot(enum.StrEnum):
    KEEP = "keep"
    REFUND = "refund"  # -> released, given back
    SPEND = "spend"  # -> spent_unknown


@attrs.frozen(kw_only=True)
class LostSlotFacts:
    claim_live: bool  # the item is processing under the reservation's ownership epoch
    window_passed: bool  # now >= expires_at + clock spread
    gate: SendGate | None  # None: unknown (a row of the previous build)
    checkpointed: bool  # an effect attempt exists for (work id, ownership epoch)


def decide_lost_slot(facts: LostSlotFacts) -> LostSlot:
    if facts.claim_live or not facts.window_passed:
        return LostSlot.KEEP
    if facts.gate is SendGate.CHECKPOINT:
        return LostSlot.SPEND if facts.checkpointed else LostSlot.REFUND
    if facts.gate is SendGate.GRANTED:
        return LostSlot.REFUND
    return LostSlot.SPEND  # handed to a read, or unknown: it may have left
