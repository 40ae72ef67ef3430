"""How widely a replica spreads its claims over the ready set (pure).

Every replica reads the same oldest-first ready set, so replicas that claim at the
same moment pick the same rows: the second UPDATE waits on the first's row locks and
then matches nothing (a lost claim race). Exclusivity stays with the row CAS; this
only makes races rare. A claim names a *spread*: the number of batch-sized slots of
the ready set (oldest first) it may start in; it starts in one of them at random
(``storage/work_claims.py``), so two concurrent claimants collide with probability
about 1/spread instead of about 1/4 (the strides of one oldest window).

The spread adapts to what the replica sees, like a congestion window turned around:

* a claim that lost races doubles it (at least to ``FIRST_SPREAD``, at most
  ``MAX_SPREAD``): more replicas claiming at once need more slots;
* a full claim without a lost race narrows it by one slot, down to ``FIRST_SPREAD``
  while the replica stays busy, so that the claims come back towards the oldest rows;
* a claim that came back short (the ready set is shallow, or the replica is idle)
  halves it, down to 1: the oldest window, where a lone replica always claims (a
  slot deeper than the ready set falls back to the oldest window, at the cost of a
  second read, so the spread of an idle replica decays rather than dropping at once:
  the next burst finds replicas still spread).

So a lone replica claims oldest first as before, and claim order departs from
oldest-first by at most ``spread x batch`` rows, only while replicas contend.
Concurrent claimants collide with probability about ``1 - (1 - 1/spread)^(c - 1)``;
the cap keeps that near 0.1 for 32 replicas claiming at once (docs/performance.md).
"""

from __future__ import annotations

# One: no slots, the strides of the oldest window (about four batches).
NO_SPREAD = 1
FIRST_SPREAD = 16
MAX_SPREAD = 256


def next_spread(spread: int, *, limit: int, claimed: int, contended: int) -> int:
    """The spread of the next claim, after one that asked for ``limit`` items,
    got ``claimed`` and lost ``contended`` races."""
    if contended > 0:
        return min(MAX_SPREAD, max(FIRST_SPREAD, spread * 2))
    if claimed < limit:
        return max(NO_SPREAD, spread // 2)
    return max(min(spread, FIRST_SPREAD), spread - 1)
