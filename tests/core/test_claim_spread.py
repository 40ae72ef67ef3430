"""The claim spread: wider after a lost race, back towards the oldest window when
claims come back clean or short (daemon/core/claim_spread.py)."""

from __future__ import annotations

import pytest

from daemon.core.claim_spread import (
    FIRST_SPREAD,
    MAX_SPREAD,
    NO_SPREAD,
    PLACES_PER_CLAIMANT,
    claim_part,
    claim_slot,
    next_spread,
    peer_rank,
    shallow_slot,
)
from daemon.core.ids import CROCKFORD


@pytest.mark.parametrize(
    ("spread", "claimed", "contended", "expected"),
    [
        # A lost race: at least the first spread, then doubling, never past the cap.
        (NO_SPREAD, 0, 1, FIRST_SPREAD),
        (NO_SPREAD, 96, 32, FIRST_SPREAD),
        (FIRST_SPREAD, 127, 1, 2 * FIRST_SPREAD),
        (MAX_SPREAD // 2, 0, 128, MAX_SPREAD),
        (MAX_SPREAD, 0, 128, MAX_SPREAD),
        # A full claim without a lost race: one slot narrower, not below the first spread.
        (2 * FIRST_SPREAD, 128, 0, 2 * FIRST_SPREAD - 1),
        (FIRST_SPREAD, 128, 0, FIRST_SPREAD),
        (NO_SPREAD, 128, 0, NO_SPREAD),
        # A short claim (shallow ready set, or idle): halved, down to the oldest window.
        (MAX_SPREAD, 127, 0, MAX_SPREAD // 2),
        (FIRST_SPREAD, 0, 0, FIRST_SPREAD // 2),
        (2, 0, 0, NO_SPREAD),
        (NO_SPREAD, 0, 0, NO_SPREAD),
    ],
)
def test_next_spread(spread: int, claimed: int, contended: int, expected: int) -> None:
    assert next_spread(spread, limit=128, claimed=claimed, contended=contended) == expected


# --- where a claim starts among live claimants (issue 24 item 2, claims11) ---------


@pytest.mark.parametrize(
    ("me", "live", "expected"),
    [
        ("b", ["a", "b", "c"], (1, 3)),
        ("a", ["c", "b", "a"], (0, 3)),
        # Its own heartbeat not written (or read) yet: it still counts itself.
        ("b", ["a", "c"], (1, 3)),
        ("a", [], (0, 1)),
        ("a", ["a", "a"], (0, 1)),
    ],
)
def test_peer_rank(me: str, live: list[str], expected: tuple[int, int]) -> None:
    assert peer_rank(me, live) == expected


def test_peer_rank_refuses_a_nameless_claimant() -> None:
    with pytest.raises(ValueError, match="a claimant has a name"):
        peer_rank("", ["a"])


@pytest.mark.parametrize(
    ("spread", "rotation", "rank", "claimants", "expected"),
    [
        # Alone: as before (one slot: the oldest window's strides; else a random slot).
        (NO_SPREAD, 5, 0, 1, -1),
        (FIRST_SPREAD, 21, 0, 1, 5),
        # One of eight: its own rank's slots, at least PLACES_PER_CLAIMANT of them.
        (NO_SPREAD, 0, 3, 8, 3),
        (NO_SPREAD, 1, 3, 8, 11),
        (NO_SPREAD, PLACES_PER_CLAIMANT, 3, 8, 3),
        # A wider spread (after lost races) gives each rank more slots.
        (64, 7, 2, 8, 58),
        (64, 8, 2, 8, 2),
    ],
)
def test_claim_slot(spread: int, rotation: int, rank: int, claimants: int,
                    expected: int) -> None:
    assert claim_slot(spread, rotation, rank=rank, claimants=claimants) == expected


def test_claimants_reading_at_one_moment_start_in_different_slots() -> None:
    """Finding (issue 24 item 2): every replica's first claim of a burst started in the
    oldest window's four strides (spread 1), so at eight replicas each lost its first
    batch (about 0.1 lost races per item of the 10,000-item drain). By rank, whatever
    the rotations, the eight first slots are distinct."""
    for claimants in (2, 8, 32):
        for rotation in (0, 1, 7, 1 << 29):
            slots = {claim_slot(NO_SPREAD, rotation + rank * 13, rank=rank,
                                claimants=claimants) for rank in range(claimants)}
            assert len(slots) == claimants


@pytest.mark.parametrize(
    ("spread", "rotation", "rank", "claimants"),
    [(0, 0, 0, 1), (1, -1, 0, 1), (1, 0, 0, 0), (1, 0, 2, 2), (1, 0, -1, 2)],
)
def test_claim_slot_refuses_bad_inputs(spread: int, rotation: int, rank: int,
                                       claimants: int) -> None:
    with pytest.raises(ValueError, match="no slot"):
        claim_slot(spread, rotation, rank=rank, claimants=claimants)


@pytest.mark.parametrize(
    ("rotation", "rank", "claimants", "batches", "expected"),
    [
        # One batch or less: the oldest window.
        (3, 5, 8, 0, -1),
        (3, 5, 8, 1, -1),
        # Fewer batches than claimants: shared by rank, at most ceil(8 / 3) a batch.
        (3, 5, 8, 3, 2),
        (3, 7, 8, 3, 1),
        # Enough for all: the rank's own slots among them.
        (0, 5, 8, 8, 5),
        (1, 5, 8, 17, 13),
        (2, 5, 8, 17, 5),
        # Alone: any of the batches.
        (9, 0, 1, 4, 1),
    ],
)
def test_shallow_slot(rotation: int, rank: int, claimants: int, batches: int,
                      expected: int) -> None:
    assert shallow_slot(rotation, rank=rank, claimants=claimants, batches=batches) == expected


@pytest.mark.parametrize(
    ("rotation", "rank", "claimants", "batches"),
    [(-1, 0, 1, 2), (0, 0, 0, 2), (0, 3, 3, 2), (0, 0, 1, -1)],
)
def test_shallow_slot_refuses_bad_inputs(rotation: int, rank: int, claimants: int,
                                         batches: int) -> None:
    with pytest.raises(ValueError, match="no shallow slot"):
        shallow_slot(rotation, rank=rank, claimants=claimants, batches=batches)


@pytest.mark.parametrize(
    ("rank", "claimants", "expected"),
    [
        # Alone: no part, the whole ready set.
        (0, 1, ()),
        # Two: every other character of the alphabet.
        (0, 2, tuple("02468ACEGJMPRTWY")),
        (1, 2, tuple("13579BDFHKNQSVXZ")),
        # Eight: four characters each.
        (3, 8, tuple("3BKV")),
        # As many as characters: one each.
        (31, 32, ("Z",)),
        # More: two characters (33 claimants: 31 or 32 suffixes each).
        (0, 33, tuple(a + b for a in CROCKFORD for b in CROCKFORD)[0::33]),
        # More claimants than two characters can part: no part (slots only).
        (5, 1025, ()),
    ],
)
def test_claim_part(rank: int, claimants: int, expected: tuple[str, ...]) -> None:
    assert claim_part(rank, claimants) == expected


@pytest.mark.parametrize("claimants", [2, 3, 7, 8, 31, 32, 33, 64, 1024])
def test_the_parts_of_the_claimants_are_disjoint_and_cover_every_suffix(claimants: int) -> None:
    parts = [claim_part(rank, claimants) for rank in range(claimants)]
    width = len(parts[0][0])
    every = [s for part in parts for s in part]
    assert len(every) == len(set(every)) == len(CROCKFORD) ** width
    assert all(len(s) == width for s in every)
    # About equal: no part more than one suffix larger than another.
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize(("rank", "claimants"), [(0, 0), (-1, 2), (2, 2), (8, 8)])
def test_claim_part_refuses_bad_inputs(rank: int, claimants: int) -> None:
    with pytest.raises(ValueError, match="no part"):
        claim_part(rank, claimants)
