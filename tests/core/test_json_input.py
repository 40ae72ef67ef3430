"""parse_json: every kind of bad body has one stable reason; good bodies parse as json does."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.core.canonical import canonical_bytes
from daemon.core.json_input import (
    MAX_DECIMAL_CHARS,
    MAX_DEPTH,
    BadJson,
    NotExact,
    decimal_text,
    depth,
    loads_exact,
    parse_json,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"{}", {}),
        (b'{"a": [1, "x", null, true]}', {"a": [1, "x", None, True]}),
        ('{"name": "Zoë"}'.encode(), {"name": "Zoë"}),
        (b"[]", []),
        (b'"text"', "text"),
        (b"1.5", 1.5),
        (b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, eval("[" * MAX_DEPTH + "]" * MAX_DEPTH)),
    ],
)
def test_good_bodies_parse(raw: bytes, expected: Any) -> None:
    assert parse_json(raw) == expected


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xff\xfe{}", "not_utf8"),  # json.loads would guess UTF-16 and raise its own error
        (b'{"reason": "\xe9"}', "not_utf8"),  # Latin-1, not UTF-8
        ('{"a": 1}'.encode("utf-16"), "not_utf8"),
        (b"\xef\xbb\xbf{}", "malformed"),  # a UTF-8 byte order mark
        (b"", "malformed"),
        (b"{not json", "malformed"),
        (b"NaN", "malformed"),
        (b'{"x": Infinity}', "malformed"),
        (b"[-Infinity]", "malformed"),
        (b"[" * 1000, "too_deep"),  # today: RecursionError
        (b"[" * 100_000 + b"]" * 100_000, "too_deep"),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "too_deep"),
        (b'{"a": ' * (MAX_DEPTH + 1) + b"1" + b"}" * (MAX_DEPTH + 1), "too_deep"),
    ],
)
def test_bad_bodies_have_a_stable_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(BadJson) as caught:
        parse_json(raw)
    assert caught.value.reason == reason
    assert caught.value.message and "\n" not in caught.value.message


@pytest.mark.parametrize(
    ("value", "levels"),
    [(1, 0), ("x", 0), (None, 0), ([], 1), ({}, 1), ([[]], 2), ({"a": [1, {"b": []}]}, 4),
     ([1, [2, [3]], []], 3)],
)
def test_depth(value: Any, levels: int) -> None:
    assert depth(value) == levels


# A provider's fractional number is carried as its exact decimal text: a JSON string
# (amounts travel as strings or integers; a binary float is never made).
@pytest.mark.parametrize(("literal", "text"), [
    ("1.5", "1.5"),
    ("1.50", "1.5"),
    ("0.1", "0.1"),
    ("-2.25", "-2.25"),
    ("1.0", "1"),
    ("-0.0", "0"),
    ("0.000", "0"),
    ("1e2", "100"),
    ("1E+2", "100"),
    ("2.5e-3", "0.0025"),
    ("1E-7", "0.0000001"),
    ("12345678901234567890.123456789", "12345678901234567890.123456789"),
    ("0.30000000000000004", "0.30000000000000004"),
])
def test_a_fractional_number_becomes_its_exact_decimal_text(literal: str, text: str) -> None:
    assert decimal_text(literal) == text


@pytest.mark.parametrize("literal", ["1e999999", "1e-999999", "9" * 200 + ".5", "1e60"])
def test_a_number_too_long_to_write_out_is_refused(literal: str) -> None:
    with pytest.raises(NotExact):
        decimal_text(literal)


def test_loads_exact_keeps_integers_and_makes_fractions_text() -> None:
    doc = loads_exact(b'{"n": 3, "x": 12.50, "big": 123456789012345678901234567890,'
                      b' "l": [0.1, 2e1], "s": "1.5"}')
    assert doc == {"n": 3, "x": "12.5", "big": 123456789012345678901234567890,
                   "l": ["0.1", "20"], "s": "1.5"}
    canonical_bytes(doc)  # what it returns can always be encoded canonically


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"a": NaN}', "NaN is not JSON"),
    (b'{"a": Infinity}', "Infinity is not JSON"),
    (b"{nope", "Expecting property name"),
    (b'{"a": 1e999999}', "characters written out exactly"),
])
def test_loads_exact_refuses_what_is_not_exact_json(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loads_exact(raw)


def test_the_decimal_bound_is_documented_in_characters() -> None:
    assert len(decimal_text("1" * (MAX_DECIMAL_CHARS - 2) + ".5")) == MAX_DECIMAL_CHARS
