"""Canonical JSON, digests, handoff keys and the no-effect result (pure, golden)."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from daemon.core.canonical import (
    NotCanonical,
    canonical_bytes,
    canonical_digest,
    is_digest,
    sha256_digest,
)
from daemon.core.handoff import (
    BadHandoffKey,
    EffectHandoffKey,
    NoEffectReason,
    NoEffectResult,
    TrustedRuntimeWorkScope,
    parse_no_effect,
)

SCOPE = TrustedRuntimeWorkScope("org-1", "install-9", "cap.leads", "sha256:abc")


def test_canonical_bytes_golden() -> None:
    expected = '{"a":"é","b":[1,true,null]}'.encode()
    assert canonical_bytes({"b": [1, True, None], "a": "é"}) == expected
    assert canonical_digest({}) == sha256_digest(b"{}")
    assert canonical_digest({}) == (
        "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )


@pytest.mark.parametrize("bad", [1.5, {"a": 0.1}, {1: "x"}, [object()], b"bytes"])
def test_non_canonical_values_are_refused(bad: object) -> None:
    with pytest.raises(NotCanonical):
        canonical_bytes(bad)


@pytest.mark.parametrize(("bad", "where"), [
    ({"a": [1, {"b": 0.5}]}, "a[1].b: floats"),
    ([{"x": {2: "y"}}], "[0].x: object keys"),
    ({"a": {"b": (1, 2)}}, "a.b: tuple is not JSON"),
    (1.5, "value: floats"),
])
def test_a_refusal_names_where_the_value_is_not_canonical(bad: object, where: str) -> None:
    """The check runs without building paths on every admitted command; a refusal still
    names the place."""
    with pytest.raises(NotCanonical) as refused:
        canonical_bytes(bad)
    assert str(refused.value).startswith(where)


class _Label(str):
    pass


def test_str_and_int_subclasses_stay_canonical() -> None:
    """What ``json`` encodes as a string or a number is accepted, subclasses too."""
    assert canonical_bytes({"k": _Label("v"), "n": True}) == b'{"k":"v","n":true}'


@pytest.mark.parametrize(("text", "ok"), [
    ("sha256:" + "0" * 64, True),
    ("sha256:" + "af09" * 16, True),
    ("sha256:" + "A" * 64, False),
    ("sha256:" + "0" * 63, False),
    ("sha256:" + "0" * 65, False),
    ("sha256:" + "0" * 64 + "\n", False),
    ("sha512:" + "0" * 64, False),
    ("sha256:" + "\u0660" * 64, False),  # Arabic-Indic zero: a digit, not hex
])
def test_is_digest(text: str, ok: bool) -> None:
    assert is_digest(text) is ok


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=20,
)


@given(json_values)
def test_canonical_is_stable_under_key_order(value: object) -> None:
    assert canonical_bytes(json.loads(json.dumps(value))) == canonical_bytes(value)
    assert is_digest(canonical_digest(value))


def test_handoff_key_golden_and_round_trip() -> None:
    key = EffectHandoffKey(SCOPE, "int-1")
    assert key.encode() == "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:int-1"
    assert EffectHandoffKey.parse(key.encode()) == key


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "ehk2:a:b:c:d:e",
        "ehk1:a:b:c:d",
        "ehk1:a:b:c:d:e:f",
        "ehk1:a::c:d:e",
        "ehk1:a:b:c:d:%ZZ",
        "ehk1:a:b:c:d:%C3%28",  # not UTF-8
        "ehk1:A%2Db:b:c:d:e",  # not canonical: '-' must not be escaped
        "ehk1:" + "a" * 600 + ":b:c:d:e",
    ],
)
def test_malformed_handoff_keys_are_refused(bad: str) -> None:
    with pytest.raises(BadHandoffKey):
        EffectHandoffKey.parse(bad)


@given(st.lists(st.text(min_size=1, max_size=30), min_size=5, max_size=5))
def test_any_components_round_trip(parts: list[str]) -> None:
    key = EffectHandoffKey(TrustedRuntimeWorkScope(*parts[:4]), parts[4])
    try:
        text = key.encode()
    except BadHandoffKey:
        assume(False)  # percent-encoded beyond the length limit: refused, not our case
        raise
    assert len(text) <= 512
    assert EffectHandoffKey.parse(text) == key


@given(st.text(max_size=80))
def test_parse_never_crashes(text: str) -> None:
    with contextlib.suppress(BadHandoffKey):
        EffectHandoffKey.parse(text)


def test_no_effect_result_golden() -> None:
    result = NoEffectResult(NoEffectReason.REJECTED_BEFORE_DISPATCH)
    assert result.canonical == (
        b'{"outcome":"NO_EFFECT","reason":"REJECTED_BEFORE_DISPATCH","version":1}'
    )
    assert result.digest == sha256_digest(result.canonical)
    assert parse_no_effect(result.canonical.decode(), result.digest) == result


@pytest.mark.parametrize(
    ("canonical", "message"),
    [
        ('{"outcome":"NO_EFFECT","reason":"TIMEOUT","version":1}', "unknown no-effect reason"),
        ('{"outcome":"NO_EFFECT","reason":"DEFINITIVE_NO_EFFECT","version":2}', "version 1"),
        ('{"outcome":"SUCCESS","reason":"DEFINITIVE_NO_EFFECT","version":1}', "version 1"),
        ('{"reason":"DEFINITIVE_NO_EFFECT","outcome":"NO_EFFECT","version":1}', "canonical form"),
        ('{"outcome":"NO_EFFECT","reason":"DEFINITIVE_NO_EFFECT","version":1,"x":1}', "exactly"),
        ("not json", "not JSON"),
    ],
)
def test_bad_no_effect_results_are_refused(canonical: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_no_effect(canonical, sha256_digest(canonical.encode()))


def test_no_effect_digest_must_match() -> None:
    result = NoEffectResult(NoEffectReason.DEFINITIVE_NO_EFFECT)
    with pytest.raises(ValueError, match="digest"):
        parse_no_effect(result.canonical.decode(), "sha256:" + "0" * 64)
