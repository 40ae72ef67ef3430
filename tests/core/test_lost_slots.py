"""The lost claim's slot decision, table-driven (issue 20 item 6): kept while its claim
lives or its window is open, spent when a request may have left, refunded only when none
can have."""

from __future__ import annotations

import pytest

from daemon.core.lost_slots import LostSlot, LostSlotFacts, SendGate, decide_lost_slot

C, G, H = SendGate.CHECKPOINT, SendGate.GRANTED, SendGate.HANDED


@pytest.mark.parametrize(("live", "passed", "gate", "checkpointed", "expected"), [
    # The claim still lives: it settles its own slot, whatever else holds.
    (True, True, C, False, LostSlot.KEEP),
    (True, True, G, False, LostSlot.KEEP),
    (True, True, None, False, LostSlot.KEEP),
    # Lost, but the window is open: a request may still start on it (never earlier).
    (False, False, C, False, LostSlot.KEEP),
    (False, False, G, False, LostSlot.KEEP),
    (False, False, H, False, LostSlot.KEEP),
    # An effect's claim that never checkpointed: nothing can have left.
    (False, True, C, False, LostSlot.REFUND),
    # ... that checkpointed: its request may have left: spent, never refunded.
    (False, True, C, True, LostSlot.SPEND),
    # A read's slot reserve never handed out: nothing can have left.
    (False, True, G, False, LostSlot.REFUND),
    # Handed to a read (no checkpoint says whether it left), or a previous build's row.
    (False, True, H, False, LostSlot.SPEND),
    (False, True, None, False, LostSlot.SPEND),
    (False, True, None, True, LostSlot.SPEND),
])
def test_decide_lost_slot(live: bool, passed: bool, gate: SendGate | None,
                          checkpointed: bool, expected: LostSlot) -> None:
    assert decide_lost_slot(LostSlotFacts(claim_live=live, window_passed=passed, gate=gate,
                                          checkpointed=checkpointed)) is expected
