"""Who may call the token endpoint for a grant's version, as a pure decision (seed 8.2).

A rotating refresh token is spent the moment the provider answers, whether or not the
answer ever reaches us. So the refresh lease row records, right before the call, that
the call was dispatched (``call_sent``; storage/refresh_leases.py), and a successor
decides from the grant and that row alone:

======================================================  ======================
facts                                                    decision
======================================================  ======================
grant not valid                                          ``UNUSABLE``
grant already past the version the caller saw            ``USE``
a live lease                                             ``WAIT``
an expired lease for this version whose call was sent    ``IN_DOUBT``
  (or whose owner's build wrote no marker), refresh
an expired lease for this version whose call was sent,   ``REFRESH``
  mint (an app JWT spends nothing)
no lease, an idle one, an expired lease for an older     ``REFRESH``
  version, or one for this version whose call never left
======================================================  ======================

``IN_DOUBT``: nobody presents that refresh token again. The grant is marked
``needs_reauthorization`` with the reason ``refresh_in_doubt``, and the unfinished owner
(if it is alive: frozen, starved) heals it when its answer arrives, or, if it never sent
after all, when it ends its lease unspent (valid at the same version). If its process died
in that window, the rotated token died with it; no design can recover a token only the
dead process saw, so the binding needs re-authorization.
"""

from __future__ import annotations

import enum

import attrs


class RefreshDecision(enum.Enum):
    UNUSABLE = "unusable"
    USE = "use"
    WAIT = "wait"
    IN_DOUBT = "in_doubt"
    REFRESH = "refresh"


@attrs.frozen
class RefreshFacts:
    grant_valid: bool
    grant_version: int
    # The version the caller saw (and would refresh from).
    seen_version: int
    # A lease token is held, and until when (microseconds since the epoch).
    held: bool
    until_us: int
    # The version the holder refreshes from.
    from_version: int
    # The holder's acquisition wrote the dispatch marker's token (this build or later).
    marked: bool
    # The holder committed that its call left.
    call_sent: bool
    # A refresh presents a rotating refresh token; a mint presents a fresh app JWT.
    spends_credential: bool
    now_us: int


def decide_refresh(facts: RefreshFacts) -> RefreshDecision:
    if not facts.grant_valid:
        return RefreshDecision.UNUSABLE
    if facts.grant_version > facts.seen_version:
        return RefreshDecision.USE
    if not facts.held:
        return RefreshDecision.REFRESH
    if facts.until_us >= facts.now_us:
        return RefreshDecision.WAIT
    if facts.from_version != facts.grant_version:
        # An unfinished refresh of an older version: that token was replaced since.
        return RefreshDecision.REFRESH
    may_have_left = facts.call_sent or not facts.marked
    if may_have_left and facts.spends_credential:
        return RefreshDecision.IN_DOUBT
    return RefreshDecision.REFRESH
