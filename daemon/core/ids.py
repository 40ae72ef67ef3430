"""Identifier codecs (pure).

Work ids are ULIDs: 48 bits of milliseconds and 80 random bits in Crockford
base32, 26 characters. They sort by creation time, which keeps InnoDB and
SQLite b-tree inserts append-mostly, but nothing relies on that order for
correctness. The caller supplies the clock reading and the random bytes, so
this module stays free of I/O.
"""

from __future__ import annotations

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ULID_LENGTH = 26
_DECODE = {c: i for i, c in enumerate(CROCKFORD)}
# Every 10-bit value's two characters: a ULID's 130 bits (two leading zeros) are 13 of them.
_PAIRS = tuple(a + b for a in CROCKFORD for b in CROCKFORD)


def encode_ulid(millis: int, randomness: bytes) -> str:
    """Encode a ULID from a millisecond timestamp and 10 random bytes."""
    if not 0 <= millis < 1 << 48:
        raise ValueError("ULID timestamp out of range")
    if len(randomness) != 10:
        raise ValueError("ULID randomness must be 10 bytes")
    v = (millis << 80) | int.from_bytes(randomness, "big")
    p = _PAIRS
    # Unrolled (one id per row written): a loop over the 26 characters cost twice as much.
    return (p[v >> 120] + p[v >> 110 & 1023] + p[v >> 100 & 1023] + p[v >> 90 & 1023]
            + p[v >> 80 & 1023] + p[v >> 70 & 1023] + p[v >> 60 & 1023] + p[v >> 50 & 1023]
            + p[v >> 40 & 1023] + p[v >> 30 & 1023] + p[v >> 20 & 1023] + p[v >> 10 & 1023]
            + p[v & 1023])


def is_ulid(text: str) -> bool:
    """True when ``text`` is a well-formed, in-range ULID."""
    return len(text) == ULID_LENGTH and text[0] in "01234567" and all(c in _DECODE for c in text)


def ulid_millis(text: str) -> int:
    """The millisecond timestamp encoded in a ULID."""
    if not is_ulid(text):
        raise ValueError("not a ULID")
    value = 0
    for c in text:
        value = (value << 5) | _DECODE[c]
    return value >> 80
