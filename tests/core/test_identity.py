"""Remote-identity codecs: frozen golden vectors and coordinate validation."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from daemon.core.identity import (
    BadCoordinate,
    integration_link_key_v2,
    integration_remote_locator_hash,
    integration_scope_digest,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "identity_v2.json").read_text())
CODECS: dict[str, Callable[..., str]] = {
    "scope": integration_scope_digest,
    "link_key": integration_link_key_v2,
    "locator": integration_remote_locator_hash,
}


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['kind']}-{c['output'][:12]}")
def test_golden_vectors(case: dict[str, object]) -> None:
    inputs = case["inputs"]
    assert isinstance(inputs, dict)
    assert CODECS[str(case["kind"])](**inputs) == case["output"]


def test_golden_file_covers_every_codec() -> None:
    assert {c["kind"] for c in GOLDEN["cases"]} == set(CODECS)


def test_whitespace_around_remote_ids_does_not_change_the_locator() -> None:
    scope = integration_scope_digest("o", "i", "hubspot", "a")
    assert integration_remote_locator_hash(scope, "contact", " 7\n") == (
        integration_remote_locator_hash(scope, "contact", "7"))
    assert integration_remote_locator_hash(scope, "contact", "7 8") != (
        integration_remote_locator_hash(scope, "contact", "78"))


def test_link_keys_carry_the_prefix_and_separate_scopes() -> None:
    a = integration_scope_digest("o", "i", "hubspot", "a")
    b = integration_scope_digest("o", "i", "hubspot", "b")
    assert integration_link_key_v2(a, "lead", "1").startswith("ilk2:")
    assert integration_link_key_v2(a, "lead", "1") != integration_link_key_v2(b, "lead", "1")
    # Field boundaries matter: ("ab", "c") and ("a", "bc") differ.
    assert integration_scope_digest("ab", "c", "p", "x") != integration_scope_digest(
        "a", "bc", "p", "x")


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: integration_scope_digest("", "i", "p", "a"), "org_id"),
        (lambda: integration_scope_digest("o\x1fx", "i", "p", "a"), "separator"),
        (lambda: integration_link_key_v2("nothex", "lead", "1"), "scope_digest"),
        (lambda: integration_link_key_v2("0" * 64, "lead", ""), "local_id"),
        (lambda: integration_remote_locator_hash("0" * 64, "contact", " \t"), "remote_id"),
        (lambda: integration_remote_locator_hash("0" * 64, "contact\x1e", "1"), "separator"),
    ],
)
def test_bad_coordinates_are_refused(call: object, message: str) -> None:
    with pytest.raises(BadCoordinate, match=message):
        call()  # type: ignore[operator]
