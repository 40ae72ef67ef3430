"""The canonical content of a Catalog revision: encoding, digest and parsing (pure)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import attrs
import pytest

from config.catalog import (
    CatalogError,
    binding_fields,
    build_catalog,
    load_catalog,
    load_documents,
)
from config.catalog_revisions import catalog_from_content
from config.settings import BindingSettings, CatalogSettings, QuotaScope, Secret, Settings
from daemon.core.canonical import NotCanonical
from daemon.core.catalog_content import (
    BadContent,
    content_bytes,
    content_digest,
    decode,
    encode,
    parse_content,
)

ROUND_TRIPS: list[tuple[Any, Any]] = [
    (30.0, {"$float": "30.0"}),
    (0.1, {"$float": "0.1"}),
    (-2.5e-07, {"$float": "-2.5e-07"}),
    (7, 7),
    (True, True),
    (None, None),
    ("30.0", "30.0"),  # a string stays a string: it does not turn into a float
    ([1.5, "x", [2.0]], [{"$float": "1.5"}, "x", [{"$float": "2.0"}]]),
    ({"a": {"b": 1.0}}, {"a": {"b": {"$float": "1.0"}}}),
]


@pytest.mark.parametrize(("value", "encoded"), ROUND_TRIPS)
def test_floats_travel_tagged_and_come_back_exactly(value: Any, encoded: Any) -> None:
    assert encode(value) == encoded
    back = decode(encoded)
    assert back == value and type(back) is type(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "not a finite number"),
        ({"x": float("inf")}, "x: inf is not a finite number"),
        ({"$float": "1.0"}, "reserved"),
        ({"d": datetime.date(2026, 1, 1)}, "d: date is not JSON"),
    ],
)
def test_values_that_cannot_be_stored_are_refused(value: Any, message: str) -> None:
    with pytest.raises(NotCanonical, match=message):
        encode(value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not JSON"),
        ("[]", "exactly bindings and definitions"),
        ('{"bindings": [], "definitions": [], "x": 1}', "exactly bindings and definitions"),
        ('{"bindings": {}, "definitions": []}', "must be arrays"),
        ('{"bindings": [{"$float": 1}], "definitions": []}', "only a decimal string"),
        ('{"bindings": [{"$float": "x"}], "definitions": []}', "not a number"),
    ],
)
def test_stored_content_that_is_not_a_revision_is_refused(text: str, message: str) -> None:
    with pytest.raises(BadContent, match=message):
        parse_content(text)


def _settings(revision: int = 3, base_url: str = "http://127.0.0.1:1") -> Settings:
    return Settings(catalog=CatalogSettings(revision=revision), bindings=(BindingSettings(
        binding_id="b1", provider="hubspot", org_id="o", app_installation_id="i",
        remote_account_id="r", base_url=base_url, max_in_flight=1.5,
        auth="static_token", token=Secret("tok-secret-1")),))


def test_the_digest_is_of_the_content_not_of_the_revision_number() -> None:
    three, four = load_catalog(_settings(3)), load_catalog(_settings(4))
    assert three.digest == four.digest and three.revision != four.revision
    assert load_catalog(_settings(base_url="http://127.0.0.1:2")).digest != three.digest
    assert three.digest == content_digest(three.content.encode())


def test_a_stored_revision_parses_back_to_the_same_definitions_without_secrets() -> None:
    served = load_catalog(_settings())
    assert "tok-secret-1" not in served.content
    back = catalog_from_content(3, served.digest, served.content, served.bindings)
    assert back.operations == served.operations
    assert back.bindings == served.bindings  # the token comes from the current settings
    assert back.digest == served.digest
    bare = catalog_from_content(3, served.digest, served.content)
    binding = bare.binding("b1")
    assert binding is not None and binding.token is None and binding.max_in_flight == 1.5


def test_content_that_differs_from_its_digest_is_refused() -> None:
    served = load_catalog(_settings())
    tampered = served.content.replace("jobtitle", "email")
    with pytest.raises(CatalogError, match="stored content has digest"):
        catalog_from_content(3, served.digest, tampered)


def test_a_revision_with_a_binding_field_it_cannot_hold_is_refused() -> None:
    documents = load_documents()
    fields = binding_fields(_settings().bindings[0]) | {"token": "leak"}
    text = content_bytes(documents, [fields]).decode()
    with pytest.raises(CatalogError, match=r"bindings\[0\]: not the non-secret fields"):
        catalog_from_content(1, content_digest(text.encode()), text)


def test_other_l1_documents_make_other_operations() -> None:
    documents = load_documents()
    hubspot = next(d for d in documents if d["provider"] == "hubspot")
    changed = [dict(hubspot, operations={
        name: dict(table, request=dict(table["request"],
                                       path="/crm/v3/objects/contacts/{remote_id}/v2"))
        for name, table in hubspot["operations"].items()})]
    catalog = build_catalog(2, changed, ())
    (op,) = catalog.operations.values()
    assert op.request.path.text.endswith("/v2")
    assert catalog.digest != build_catalog(2, documents, ()).digest


def test_a_bindings_quota_scope_is_catalog_content_and_parses_back() -> None:
    plain = load_catalog(_settings())
    settings = _settings()
    (b,) = settings.bindings
    scoped = attrs.evolve(b, quota=(QuotaScope(dimension="per_app_10s", scope="provider_key",
                                               key="shared-7"),))
    served = load_catalog(attrs.evolve(settings, bindings=(scoped,)))
    # Another scope is another Catalog (what the work pinned counts where it did)...
    assert served.digest != plain.digest
    back = catalog_from_content(3, served.digest, served.content, served.bindings)
    assert back.bindings == served.bindings
    # ...and a binding without overrides keeps the content it had before they existed.
    assert "quota" not in json.loads(plain.content)["bindings"][0]
