"""ULID codec and batch shaping."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.ids import encode_ulid, is_ulid, ulid_millis
from daemon.core.lanes import Candidate, pick_batch


def test_ulid_golden() -> None:
    # The ULID reference implementation's example: ulid(1469918176385) -> 01ARYZ6S41...
    assert encode_ulid(1469918176385, bytes(10)) == "01ARYZ6S41" + "0" * 16
    assert encode_ulid(0, b"\xff" * 10) == "0000000000" + "Z" * 16


@given(st.integers(0, (1 << 48) - 1), st.binary(min_size=10, max_size=10))
def test_ulid_round_trip_and_order(millis: int, rand: bytes) -> None:
    text = encode_ulid(millis, rand)
    assert is_ulid(text)
    assert ulid_millis(text) == millis
    assert encode_ulid(millis, bytes(10)) <= text


@pytest.mark.parametrize("bad", ["", "short", "8" + "0" * 25, "0" * 25 + "U", "0" * 27])
def test_malformed_ulids_are_refused(bad: str) -> None:
    assert not is_ulid(bad)
    with pytest.raises(ValueError, match="ULID"):
        ulid_millis(bad)


def _ulid_one_character_at_a_time(millis: int, randomness: bytes) -> str:
    """The encoder as it was before its unrolled form: the reference the ids in stored
    rows were written by (26 five-bit groups, most significant first)."""
    value = (millis << 80) | int.from_bytes(randomness, "big")
    chars = []
    for _ in range(26):
        chars.append("0123456789ABCDEFGHJKMNPQRSTVWXYZ"[value & 31])
        value >>= 5
    return "".join(reversed(chars))


@pytest.mark.parametrize(("millis", "rand"), [
    (0, bytes(10)), ((1 << 48) - 1, b"\xff" * 10), (1469918176385, bytes(10)),
    (1733500000000, bytes(range(10))), (1 << 47, b"\x80" + bytes(9)), (1, b"\x01" * 10),
    *((1 << bit, bytes(10)) for bit in range(0, 48, 7)),
    *((0, (1 << bit).to_bytes(10, "big")) for bit in range(0, 80, 9)),
])
def test_ulid_table_matches_the_reference_encoder(millis: int, rand: bytes) -> None:
    assert encode_ulid(millis, rand) == _ulid_one_character_at_a_time(millis, rand)


@given(st.integers(0, (1 << 48) - 1), st.binary(min_size=10, max_size=10))
def test_ulid_matches_the_reference_encoder(millis: int, rand: bytes) -> None:
    assert encode_ulid(millis, rand) == _ulid_one_character_at_a_time(millis, rand)


def test_ulid_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="range"):
        encode_ulid(1 << 48, bytes(10))
    with pytest.raises(ValueError, match="10 bytes"):
        encode_ulid(1, bytes(9))


def c(work_id: str, org: str = "o1", source: str | None = None,
      target: str | None = None) -> Candidate:
    return Candidate(work_id, org, source, target)


@pytest.mark.parametrize(
    ("candidates", "limit", "rotation", "expected"),
    [
        ([c("a"), c("b"), c("c")], 2, 0, ["a", "b"]),
        ([c("a"), c("b")], 0, 0, []),
        # one item per source lane and per target lane within a batch
        ([c("a", source="L"), c("b", source="L"), c("c")], 5, 0, ["a", "c"]),
        ([c("a", target="T"), c("b", target="T"), c("c", target="U")], 5, 0, ["a", "c"]),
        # orgs take turns: o1's backlog cannot fill the batch
        ([c("a"), c("b"), c("c"), c("x", "o2"), c("y", "o3")], 3, 0, ["a", "x", "y"]),
        ([c("a"), c("b"), c("c"), c("x", "o2")], 4, 0, ["a", "x", "b", "c"]),
        # rotation changes which org goes first
        ([c("a"), c("x", "o2"), c("y", "o3")], 1, 1, ["x"]),
        ([c("a"), c("x", "o2"), c("y", "o3")], 1, 2, ["y"]),
    ],
)
def test_pick_batch(candidates: list[Candidate], limit: int, rotation: int,
                    expected: list[str]) -> None:
    assert [p.work_id for p in pick_batch(candidates, limit, rotation)] == expected


@given(
    st.lists(
        st.builds(
            Candidate,
            st.uuids().map(str),
            st.sampled_from(["o1", "o2", "o3"]),
            st.one_of(st.none(), st.sampled_from(["L1", "L2"])),
            st.one_of(st.none(), st.sampled_from(["T1", "T2"])),
        ),
        max_size=40,
    ),
    st.integers(0, 50),
    st.integers(0, 10),
)
def test_pick_batch_invariants(cands: list[Candidate], limit: int, rotation: int) -> None:
    picked = pick_batch(cands, limit, rotation)
    assert len(picked) <= limit
    assert len({p.work_id for p in picked}) == len(picked)
    sources = [p.source_lane for p in picked if p.source_lane]
    targets = [p.target_lane for p in picked if p.target_lane]
    assert len(sources) == len(set(sources))
    assert len(targets) == len(set(targets))
    assert all(p in cands for p in picked)
