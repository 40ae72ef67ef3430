"""Binding a local record to an existing remote record: one operator decision (seed 7, 10).

Theory of operation
-------------------
An operator (an admin: it chooses an identity) names a local record and the remote
record it is, and, when the local record is already linked, the link generation they
saw. :func:`decide_bind` answers from the facts one transaction read: adopt (no link, or
a retired one), rebind (an active link to another record: the generation moves, so work
queued under the old generation fails closed at its dispatch checkpoint), unchanged (the
same record already), or a refusal with a stable code and a sentence, in this order:

1. ``remote_linked_elsewhere``: the remote record is actively linked to another local
   record (one remote record, one local record).
2. ``generation_moved``: the operator named a generation and the link is not at it (or
   there is no link): they decided on a page that is no longer true.
3. ``link_pending_create``: a remote create for the local record is in flight; binding
   now could leave two remote records for one local record.
4. The same remote record, active: unchanged (nothing is written).
5. ``generation_required``: an active link to another record is only moved by an
   operator who names the generation they saw.
6. ``unresolved_attempt``: an effect attempt pinned to the current generation has no
   proven outcome (in flight, or unknown); after a rebind its read-back would be
   refused, so the operator disposes of it first.
"""

from __future__ import annotations

import enum

import attrs


class BindOutcome(enum.StrEnum):
    ADOPTED = "adopted"
    REBOUND = "rebound"
    UNCHANGED = "unchanged"


@attrs.frozen
class BindRefusal:
    code: str
    sentence: str


@attrs.frozen(kw_only=True)
class LinkFacts:
    """The local record's link as it is now."""

    state: str  # pending_create, active, retired
    generation: int
    locator_hash: str | None


@attrs.frozen(kw_only=True)
class BindFacts:
    """What one bind decides from, read in its transaction."""

    link: LinkFacts | None
    # The requested remote record's locator, and the key of the link that holds it
    # actively now (None: free).
    locator_hash: str
    holder_key: str | None
    own_key: str
    expected_generation: int | None
    # Effect attempts pinned to the link's current generation with no proven outcome.
    unresolved_attempts: int = 0


def decide_bind(f: BindFacts) -> BindOutcome | BindRefusal:
    """The one answer to a bind request (see the module's rules)."""
    link = f.link
    if f.holder_key is not None and f.holder_key != f.own_key:
        return BindRefusal("remote_linked_elsewhere", "the remote record is already linked to"
                           " another local record; retire or rebind that link first")
    if f.expected_generation is not None and (
            link is None or link.generation != f.expected_generation):
        now = "no link" if link is None else f"generation {link.generation}"
        return BindRefusal("generation_moved", f"the link is not at generation"
                           f" {f.expected_generation} any more ({now}): look again")
    if link is None or link.state == "retired":
        return BindOutcome.ADOPTED
    if link.state == "pending_create":
        return BindRefusal("link_pending_create", "a remote create for the local record is"
                           " in flight; binding now could leave two remote records for it")
    if link.locator_hash == f.locator_hash:
        return BindOutcome.UNCHANGED
    if f.expected_generation is None:
        return BindRefusal("generation_required", f"the local record is linked to another"
                           f" remote record at generation {link.generation}; name that"
                           " generation to rebind it")
    if f.unresolved_attempts:
        return BindRefusal("unresolved_attempt", f"{f.unresolved_attempts} effect attempt(s)"
                           f" on generation {link.generation} have no proven outcome; record"
                           " their disposition first")
    return BindOutcome.REBOUND
