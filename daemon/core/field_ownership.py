"""Which direction owns a field, and what an outbound command may therefore send (seed 7).

Every field an L2 object binding maps has exactly one owner: ``inbound`` (the provider's:
webhooks and reconciliation change it on the local record, nothing sends it back) or
``outbound`` (the local side's: its changes are sent to the provider). An outbound
command may carry only outbound-owned fields. A command naming an inbound-owned field, or
a field the binding does not map at all, is refused for good (its handoff key can never
be accepted: a retry would be refused the same way), with one of the stable codes below.

Pure: no I/O. The admission shell records the refusal durably.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

INBOUND_OWNED = "inbound_owned_field"
NOT_MAPPED = "field_not_outbound_owned"


@attrs.frozen
class Ownership:
    """The remote field names each direction owns (disjoint: the loader refuses overlap)."""

    inbound: frozenset[str]
    outbound: frozenset[str]


@attrs.frozen
class OwnershipRefusal:
    code: str
    field: str
    sentence: str


def outbound_refusal(fields: Iterable[str], ownership: Ownership) -> OwnershipRefusal | None:
    """None when every field is outbound-owned; else the first offending field (sorted,
    so the answer is the same for the same command)."""
    for field in sorted(fields):
        if field in ownership.outbound:
            continue
        if field in ownership.inbound:
            return OwnershipRefusal(INBOUND_OWNED, field, f"field {field!r} is owned by the"
                                    " provider (inbound): an outbound command never sends it")
        return OwnershipRefusal(NOT_MAPPED, field, f"field {field!r} is not an outbound"
                                " field of the object binding")
    return None
