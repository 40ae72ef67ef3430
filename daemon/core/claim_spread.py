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

A replica that knows its rank among the live claimants of the family (the heartbeats,
advice only) starts in its own rank's slots instead of any (``claim_slot``), and shares a
ready set shallower than its slot by rank (``shallow_slot``): claimants that read at the
same moment then start in different batches by construction.

A busy claimant (its last claim was full) that knows its rank claims from its own *part*
of the ready set instead (``claim_part``): the work ids ending in its rank's characters.
Parts are disjoint for claimants with one view of ``c`` and, unlike slots (offsets into
the ready set), they do not move when other claimants take rows ahead of them, which is
where claimants reading the same moment by slot still met mid-drain (docs/performance.md).

So a lone replica claims oldest first as before, and claim order departs from
oldest-first by at most ``spread x batch`` rows, only while replicas contend.
Concurrent claimants collide with probability about ``1 - (1 - 1/spread)^(c - 1)``;
the cap keeps that near 0.1 for 32 replicas claiming at once (docs/performance.md).
"""

from __future__ import annotations

from daemon.core.ids import CROCKFORD

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


# Places per live claimant of a family: a replica that knows it is one of ``c`` live
# claimants (the heartbeats, advice only) starts in one of at least ``c x
# PLACES_PER_CLAIMANT`` slots, always one of its own rank's (see ``claim_slot``).
PLACES_PER_CLAIMANT = 2


def peer_rank(me: str, live: list[str]) -> tuple[int, int]:
    """(rank, claimants): ``me``'s place among the live claimants of a family, by
    name, and how many they are (``me`` counts itself even when its own heartbeat is
    not in ``live`` yet). Advice for ``claim_slot``: a stale view only costs races."""
    if not me:
        raise ValueError("a claimant has a name")
    names = sorted(set(live) | {me})
    return names.index(me), len(names)


def claim_slot(spread: int, rotation: int, *, rank: int, claimants: int) -> int:
    """The batch-sized slot of the ready set a claim starts in; -1: none (the oldest
    window's strides, chosen by ``rotation``).

    Alone (or not knowing its peers) a claimant picks any of ``spread`` slots at
    random, as before. One of ``c`` live claimants picks among the slots of its own
    rank, ``rank + c x j``, and at least ``PLACES_PER_CLAIMANT`` of them: claimants
    that read the ready set at the same moment (the first claims of a burst) then
    start in different batches by construction instead of by luck; claimants whose
    views differ by ``k`` committed batches collide only if their ranks differ by
    ``k`` modulo ``c`` and their ``j`` agree (about ``1/places`` for that one peer)."""
    if spread < 1 or rotation < 0 or claimants < 1 or not 0 <= rank < claimants:
        raise ValueError(f"no slot for spread={spread} rotation={rotation}"
                         f" rank={rank} claimants={claimants}")
    if claimants == 1:
        return rotation % spread if spread > 1 else -1
    places = max(PLACES_PER_CLAIMANT, -(-spread // claimants))
    return rank + claimants * (rotation % places)


def shallow_slot(rotation: int, *, rank: int, claimants: int, batches: int) -> int:
    """The slot of a claim whose own slot lay beyond a ready set ``batches`` full
    batches deep (-1: the oldest window's strides). Claimants keep their rank's slots
    while there are enough batches for all of them (they start apart), and share the
    batches by rank when there are fewer (each batch then has at most
    ``ceil(c / batches)`` claimants, instead of halved slots all crowding the oldest)."""
    if rotation < 0 or claimants < 1 or not 0 <= rank < claimants or batches < 0:
        raise ValueError(f"no shallow slot for rotation={rotation} rank={rank}"
                         f" claimants={claimants} batches={batches}")
    if batches <= 1:
        return -1
    if batches >= claimants:
        return rank + claimants * (rotation % (batches // claimants))
    return rank % batches


# A claimant's own part of the ready set: the work ids whose last characters are its
# rank's (``claim_part``). Work ids are ULIDs whose last characters are random, so the
# ``c`` parts are about equal and, unlike slots (offsets into the ready set), they do
# not move when other claimants take rows ahead of them.
PAIRS = tuple(a + b for a in CROCKFORD for b in CROCKFORD)


def claim_part(rank: int, claimants: int) -> tuple[str, ...]:
    """The work-id suffixes of claimant ``rank``'s part of the ready set (empty: no
    part, the whole ready set: alone, or more claimants than two characters can
    part). One character while there are no more claimants than characters (32),
    else two (1,024 suffixes); suffix ``i`` of the alphabet belongs to rank ``i mod c``,
    so the parts of ``c`` claimants are disjoint and together cover every ULID.

    Advice like the rank: two claimants whose views of ``c`` differ read overlapping
    parts, which costs races, never exclusivity (the claim UPDATE's row CAS)."""
    if claimants < 1 or not 0 <= rank < claimants:
        raise ValueError(f"no part for rank={rank} claimants={claimants}")
    if claimants == 1 or claimants > len(PAIRS):
        return ()
    alphabet = CROCKFORD if claimants <= len(CROCKFORD) else PAIRS
    return tuple(alphabet[rank::claimants])
