"""The torture run's operator: it re-authorizes a grant that the run's own SIGKILL left in
doubt, and nothing else.

With rotating refresh tokens, a replica killed after it committed a refresh's dispatch
marker and before it activated the answer leaves the grant ``refresh_in_doubt`` for good
(docs/quota-and-credentials.md, "The trade"): nobody may present that refresh token again,
and the binding's effects wait for an operator to re-authorize it. A run whose kills land in
that window (Galera's slow commits widen it) would otherwise end "not drained" for a reason
the product documents. So during the settle, as an operator with the provider's console
would, the run re-authorizes such a grant, but only when both hold:

* the refresh lease's owner epoch was held by an incarnation the run SIGKILLed (the owner's
  ``work_executions`` row for that epoch names it; not journaled yet: wait), and
* the provider saw the in-doubt refresh token at most once (the OAuth simulator's journal).
  Never: the doubt was the kill's alone, nothing was spent. Once: the killed owner's call
  reached the provider and its answer died with the process, which is exactly the trade
  (an operator re-authorizes; the provider's console shows one use). Twice or more is a
  double refresh, never settled here: ``double_refreshes`` counts it from the same journal.

Anything else stays in doubt, and ``grants_not_valid`` and ``lost`` count it. The decision
is :func:`verdict` (pure, table-tested in tests/bench/test_torture_operator.py).
"""

from __future__ import annotations

import enum

import attrs


class Verdict(enum.Enum):
    REAUTHORIZE = "reauthorize"
    WAIT = "wait"  # the owner's epoch is not journaled yet: ask again later
    LEAVE = "leave"  # not the kill's doing: the run's invariants count it


@attrs.frozen
class Doubt:
    """What the database and the simulators say about one grant in doubt."""

    # The replica that held the refresh lease's owner epoch, from its journal row (None:
    # not journaled yet, the owner's item not reclaimed).
    owner_replica: str | None
    # How many token calls presented the in-doubt refresh token (the OAuth simulator's
    # journal).
    presentations: int
    # The refresh lease carries its dispatch marker (the call may have left).
    marked: bool


def verdict(doubt: Doubt, killed: frozenset[str]) -> Verdict:
    """Whether the run's operator re-authorizes the grant (see the module)."""
    if not doubt.marked or doubt.presentations > 1:
        return Verdict.LEAVE
    if doubt.owner_replica is None:
        return Verdict.WAIT
    return Verdict.REAUTHORIZE if doubt.owner_replica in killed else Verdict.LEAVE
