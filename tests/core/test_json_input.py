"""parse_json: every kind of bad body has one stable reason; good bodies parse as json does."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.core.json_input import MAX_DEPTH, BadJson, depth, parse_json


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
