"""Canonical JSON, digests, handoff keys and the no-effect result (pure, golden)."""

from __future__ import annotations

import contextlib
import json
import urllib.parse

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from daemon.core import handoff
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


def _parse_by_decoding_every_component(text: str) -> EffectHandoffKey:
    """The parser as it was before its fast path: the reference for which keys are
    accepted, as what, and refused with which reason."""
    if len(text) > 512:
        raise BadHandoffKey("handoff key longer than 512 characters")
    parts = text.split(":")
    if len(parts) != 6 or parts[0] != "ehk1":
        raise BadHandoffKey("expected ehk1:<org>:<install>:<capability>:<binding>:<id>")
    try:
        org, install, capability, binding, handoff_id = (
            urllib.parse.unquote(p, errors="strict") for p in parts[1:])
    except UnicodeDecodeError:
        raise BadHandoffKey("handoff key components must be UTF-8") from None
    if not all((org, install, capability, binding, handoff_id)):
        raise BadHandoffKey("every handoff key component must be non-empty")
    key = EffectHandoffKey(TrustedRuntimeWorkScope(org, install, capability, binding),
                           handoff_id)
    if key.encode() != text:
        raise BadHandoffKey("handoff key is not in canonical form")
    return key


def _outcome(parse: object, text: str) -> object:
    try:
        return parse(text)  # type: ignore[operator]
    except BadHandoffKey as exc:
        return ("refused", str(exc))


# Keys near the fast path's edges: a plain id under a scope that is or is not canonical,
# an id that needs decoding, separators and escapes in every position.
_KEY_TABLE = [
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:int-1",
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:A.b_c~d-9",
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:int%2D1",  # id escaped needlessly
    "ehk1:org-1:install-9:cap.leads:sha256%3aabc:int-1",  # lowercase escape
    "ehk1:org-1:install-9:cap.leads:sha256:abc:int-1",  # a raw ':' in the digest
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:",
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:int 1",
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:int%201",
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:caf%C3%A9",
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:café",
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:int-1\n",
    "ehk1:org-1:install-9:cap.leads::int-1",
    "ehk1:org-1:install-9:cap.leads:%C3%28:int-1",  # not UTF-8
    "ehk1:org%2D1:install-9:cap.leads:sha256%3Aabc:int-1",  # scope escaped needlessly
    "ehk1:o%3Ar%25g:install-9:cap.leads:sha256%3Aabc:int-1",
    "ehk2:org-1:install-9:cap.leads:sha256%3Aabc:int-1",
    "ehk1:org-1:install-9:cap.leads:int-1",
    "ehk1:a:b:c:d:e:f",
    ":int-1", "int-1", "", "ehk1",
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:" + "i" * 470,  # within the limit
    "ehk1:org-1:install-9:cap.leads:sha256%3Aabc:" + "i" * 480,  # beyond it
]


@pytest.mark.parametrize("text", _KEY_TABLE)
def test_handoff_key_table_matches_the_reference_parser(text: str) -> None:
    assert _outcome(EffectHandoffKey.parse, text) == _outcome(
        _parse_by_decoding_every_component, text)
    # Again, now that the scope prefix is known: the cached answer is the same answer.
    assert _outcome(EffectHandoffKey.parse, text) == _outcome(
        _parse_by_decoding_every_component, text)


_KEY_ALPHABET = st.sampled_from([*"aZ9-._~:%/ é", "%3A", "%2D", "%C3%A9", "%zz"])


@given(st.lists(_KEY_ALPHABET, max_size=12).map("".join),
       st.lists(_KEY_ALPHABET, min_size=0, max_size=8).map("".join))
def test_handoff_keys_parse_as_the_reference_parser_does(scope_tail: str, key_id: str) -> None:
    text = f"ehk1:org-1:install-9:cap.leads:{scope_tail}:{key_id}"
    assert _outcome(EffectHandoffKey.parse, text) == _outcome(
        _parse_by_decoding_every_component, text)


def test_a_scope_prefix_is_decoded_once() -> None:
    """A Runtime sends one scope on every key: its prefix is decoded and re-encoded
    once, then every key under it is only split (the intake parses a key per command)."""
    scope = TrustedRuntimeWorkScope("org-x", "install-x", "cap.x", "sha256:" + "d" * 64)
    first = EffectHandoffKey(scope, "int-a").encode()
    assert EffectHandoffKey.parse(first).scope == scope
    before = handoff._canonical_scope.cache_info()
    for n in range(5):
        assert EffectHandoffKey.parse(EffectHandoffKey(scope, f"int-{n}").encode()).scope == scope
    after = handoff._canonical_scope.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (5, 0)


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
