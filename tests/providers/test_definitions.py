"""L1 definitions as data: parse_provider (pure) and the two shipped definitions."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Set
from importlib import resources
from typing import Any

import pytest

from config.catalog import load_definitions
from config.definitions import CatalogError, parse_provider
from config.settings import BindingSettings
from daemon.providers.executor import BadRequestForOperation, desired_fields, prepare

OP = "acme.thing.update"


def base() -> dict[str, Any]:
    return {
        "provider": "acme",
        "auth": {"key": {"header": "X-Api-Key"}},
        "operations": {OP: {
            "intent_kinds": ["UPSERT"], "local_object": "lead", "remote_object": "thing",
            "command_fields": "/fields", "allowed_fields": ["name"],
            "accepted_statuses": ["2xx"], "not_applied_statuses": [429],
            "rejected_statuses": ["4xx"],
            "request": {"method": "PUT", "path": "/things/{remote_id}",
                        "content_type": "application/json", "auth": "key",
                        "body": {"thing": "$fields"}},
            "response": {"identity": "/thing/id"},
            "read": {"method": "GET", "path": "/things/{remote_id}", "fields": "/thing"},
        }},
    }


def test_a_declared_keep_alive_reaches_every_operation() -> None:
    """How long the provider keeps an idle connection (our pool lets go at half)."""
    assert {op.keep_alive_s for op in parse_provider(base(), "acme.toml").values()} == {None}
    declared = base() | {"keep_alive": 60}
    assert {op.keep_alive_s for op in parse_provider(declared, "acme.toml").values()} == {60.0}


def test_a_minimal_definition_parses() -> None:
    (op,) = parse_provider(base(), "acme.toml").values()
    assert (op.name, op.provider, op.method, op.request.auth.header) == (
        OP, "acme", "PUT", "X-Api-Key")
    assert op.request.auth.prefix == "" and op.request.idempotency_header == ""
    assert op.read is not None and op.read.auth == op.request.auth  # inherited
    assert op.read.absent_statuses == frozenset({404})
    assert op.contract.not_applied_statuses == frozenset({429})


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    table = doc
    for p in parents:
        table = table[OP if p == "OP" else p]
    if value is _DELETE:
        del table[last]
    else:
        table[last] = value


_DELETE = object()
K = f"providers.acme.operations.{OP}"


@pytest.mark.parametrize(
    ("path", "value", "key", "says"),
    [
        ("operations.OP.request.body", {"thing": "$feilds"}, f"{K}.request.body.thing",
         "unknown placeholder '$feilds'"),
        ("operations.OP.request.body", {"a": {"b": ["$x"]}}, f"{K}.request.body.a.b[0]",
         "unknown placeholder"),
        ("operations.OP.request.body", "$fields", f"{K}.request.body", "expected a table"),
        ("operations.OP.request.body", _DELETE, f"{K}.request.body", "missing"),
        ("operations.OP.request.path", "/things/{id}", f"{K}.request.path",
         "unknown path field {id}"),
        ("operations.OP.request.path", "things", f"{K}.request.path", "starting with /"),
        ("operations.OP.request.method", "FETCH", f"{K}.request.method", "expected one of"),
        ("operations.OP.request.content_type", "json", f"{K}.request.content_type",
         "media type"),
        ("operations.OP.request.content_type", _DELETE, f"{K}.request.content_type",
         "missing"),
        ("operations.OP.request.auth", "oauth", f"{K}.request.auth", "no auth scheme 'oauth'"),
        ("operations.OP.request.auth", _DELETE, f"{K}.request.auth", "missing"),
        ("operations.OP.request.idempotency_header", "Bad Header",
         f"{K}.request.idempotency_header", "header name"),
        ("operations.OP.request.extra", 1, f"{K}.request.extra", "unknown key"),
        ("operations.OP.request", _DELETE, f"{K}.request", "missing"),
        ("operations.OP.response.identity", "thing/id", f"{K}.response.identity",
         "malformed JSON pointer"),
        ("operations.OP.response.identity", "/a~9", f"{K}.response.identity",
         "malformed JSON pointer"),
        ("operations.OP.response.evidence_fields", {"id": "id"},
         f"{K}.response.evidence_fields.id", "malformed JSON pointer"),
        ("operations.OP.response.evidence_headers", ["x y"], f"{K}.response.evidence_headers",
         "not a header name"),
        ("operations.OP.read.fields", "attributes", f"{K}.read.fields",
         "malformed JSON pointer"),
        ("operations.OP.read.fields", _DELETE, f"{K}.read.fields", "missing"),
        ("operations.OP.read.updated_at", 3, f"{K}.read.updated_at", "JSON pointer"),
        ("operations.OP.read.path", "/things/{properties}", f"{K}.read.path",
         "unknown path field"),
        ("operations.OP.read.absent_statuses", [404, "410"], f"{K}.read.absent_statuses",
         "status codes"),
        ("operations.OP.read.auth", "nope", f"{K}.read.auth", "no auth scheme"),
        ("operations.OP.command_fields", "fields", f"{K}.command_fields",
         "malformed JSON pointer"),
        ("operations.OP.command_fields", _DELETE, f"{K}.command_fields", "missing"),
        ("operations.OP.allowed_fields", [], f"{K}.allowed_fields", "at least one"),
        ("operations.OP.allowed_fields", _DELETE, f"{K}.allowed_fields", "missing"),
        ("operations.OP.intent_kinds", "UPSERT", f"{K}.intent_kinds", "expected list"),
        ("operations.OP.local_object", _DELETE, f"{K}.local_object", "missing"),
        ("operations.OP.not_applied_statuses", [429, True], f"{K}.not_applied_statuses",
         "True is not an HTTP status code"),
        ("operations.OP.accepted_statuses", [200, 600], f"{K}.accepted_statuses",
         "600 is not an HTTP status code (100-599)"),
        ("operations.OP.accepted_statuses", [99], f"{K}.accepted_statuses",
         "99 is not an HTTP status code"),
        ("operations.OP.rejected_statuses", ["4XX"], f"{K}.rejected_statuses",
         "'4XX' is not an HTTP status code"),
        ("operations.OP.rejected_statuses", ["6xx"], f"{K}.rejected_statuses",
         "'6xx' is not"),
        ("operations.OP.rejected_statuses", [True], f"{K}.rejected_statuses", "True is not"),
        ("operations.OP.rejected_statuses", "4xx", f"{K}.rejected_statuses", "expected a list"),
        ("operations.OP.rejected_statuses", [429], f"{K}.rejected_statuses",
         "status 429 is also in not_applied_statuses"),
        ("operations.OP.rejected_statuses", ["2xx"], f"{K}.rejected_statuses",
         "status class 2xx is also in accepted_statuses"),
        ("operations.OP.replay_safe", "no", f"{K}.replay_safe", "true or false"),
        # Replay safety is a declared mechanism L0 checks, never a bare claim.
        ("operations.OP.replay_safe", True, f"{K}.replay_safe",
         "claims replay safety without a mechanism L0 can check"),
        ("operations.OP.replay_proof", {"idempotency_header": "Idempotency-Key",
                                        "key_retention": 86400},
         f"{K}.replay_proof", "a replay proof without replay_safe = true"),
        # Each status's meaning is declared; L0 has no default for any, 429 included.
        ("operations.OP.not_applied_statuses", _DELETE, f"{K}.not_applied_statuses",
         "missing: an operation declares what each status means"),
        ("operations.OP.accepted_statuses", _DELETE, f"{K}.accepted_statuses", "missing"),
        ("operations.OP.rejected_statuses", _DELETE, f"{K}.rejected_statuses", "missing"),
        ("operations.OP.max_in_flight", -1, f"{K}.max_in_flight", "non-negative"),
        ("operations.OP.allowed_properties", ["name"], f"{K}.allowed_properties",
         "unknown key"),
        ("auth.key.header", "Bad Header", "providers.acme.auth.key.header", "header name"),
        ("auth.key.header", _DELETE, "providers.acme.auth.key.header", "missing"),
        ("auth.key.prefix", "a\nb", "providers.acme.auth.key.prefix", "single-line"),
        ("auth.key.scheme", "bearer", "providers.acme.auth.key.scheme", "unknown key"),
        ("auth", "bearer", "providers.acme.auth", "expected a table"),
        ("color", "blue", "providers.acme.color", "unknown key"),
        ("keep_alive", 0.5, "providers.acme.keep_alive", "seconds from 1 to 3600"),
        ("keep_alive", "60", "providers.acme.keep_alive", "seconds from 1 to 3600"),
    ],
)
def test_a_bad_definition_names_the_key(path: str, value: Any, key: str, says: str) -> None:
    doc = copy.deepcopy(base())
    _set(doc, path, value)
    with pytest.raises(CatalogError) as caught:
        parse_provider(doc, "acme.toml")
    assert caught.value.key == key
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


R2XX, R4XX, R5XX = (frozenset(range(c, c + 100)) for c in (200, 400, 500))


@pytest.mark.parametrize(
    ("declared", "accepted", "not_applied", "rejected"),
    [
        # As the shipped definitions declare them.
        ({}, R2XX, {429}, R4XX - {429}),
        # Nothing not applied: a 429 is then a rejection like every other 4xx.
        ({"not_applied_statuses": []}, R2XX, set(), R4XX),
        # An exact code wins over a class, in either direction.
        ({"not_applied_statuses": [429, 503]}, R2XX, {429, 503}, R4XX - {429}),
        ({"accepted_statuses": [200, 204], "rejected_statuses": [400, 404, 409, 422]},
         {200, 204}, {429}, {400, 404, 409, 422}),
        ({"rejected_statuses": ["4xx", "3xx"]}, R2XX, {429},
         (R4XX - {429}) | frozenset(range(300, 400))),
        ({"accepted_statuses": ["2xx"], "not_applied_statuses": [202]},
         R2XX - {202}, {202}, R4XX),
        ({"accepted_statuses": ["2xx", 200, 200]}, R2XX, {429}, R4XX - {429}),
        # Nothing rejected: every 4xx but 429 is "maybe applied" (reconciled), never NO_EFFECT.
        ({"rejected_statuses": []}, R2XX, {429}, set()),
        ({"not_applied_statuses": [], "rejected_statuses": ["4xx", "5xx"]}, R2XX, set(),
         R4XX | R5XX),
    ],
)
def test_declared_status_semantics(declared: dict[str, Any], accepted: Set[int],
                                   not_applied: Set[int], rejected: Set[int]) -> None:
    doc = copy.deepcopy(base())
    doc["operations"][OP].update(declared)
    (op,) = parse_provider(doc, "acme.toml").values()
    got = op.contract
    assert got.accepted_statuses == accepted
    assert got.not_applied_statuses == not_applied
    assert got.rejected_statuses == rejected
    assert not got.accepted_statuses & got.rejected_statuses
    assert not (got.accepted_statuses | got.rejected_statuses) & got.not_applied_statuses


SAFE_OP = {"replay_safe": True,
           "replay_proof": {"idempotency_header": "Idempotency-Key", "key_retention": 86400}}


@pytest.mark.parametrize(
    ("changes", "key", "says"),
    [
        # The request must carry the header the proof names.
        ({}, f"{K}.request.idempotency_header", "the replay proof names Idempotency-Key"),
        ({"request.idempotency_header": "X-Other-Key"}, f"{K}.request.idempotency_header",
         "it carries X-Other-Key"),
        ({"request.idempotency_header": "Idempotency-Key",
          "replay_proof.key_retention": 0}, f"{K}.replay_proof.key_retention",
         "expected a positive number of seconds"),
        ({"request.idempotency_header": "Idempotency-Key",
          "replay_proof.key_retention": True}, f"{K}.replay_proof.key_retention", "positive"),
        ({"request.idempotency_header": "Idempotency-Key",
          "replay_proof.idempotency_header": "Bad Header"},
         f"{K}.replay_proof.idempotency_header", "header name"),
        ({"request.idempotency_header": "Idempotency-Key", "replay_proof.extra": 1},
         f"{K}.replay_proof.extra", "unknown key"),
    ],
)
def test_a_replay_proof_l0_cannot_check_names_the_key(changes: dict[str, Any], key: str,
                                                       says: str) -> None:
    doc = copy.deepcopy(base())
    doc["operations"][OP].update(copy.deepcopy(SAFE_OP))
    for path, value in changes.items():
        _set(doc, f"operations.OP.{path}", value)
    with pytest.raises(CatalogError) as caught:
        parse_provider(doc, "acme.toml")
    assert caught.value.key == key
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_declared_replay_proof_is_the_contracts() -> None:
    doc = copy.deepcopy(base())
    doc["operations"][OP].update(copy.deepcopy(SAFE_OP))
    doc["operations"][OP]["request"]["idempotency_header"] = "idempotency-key"  # any case
    (op,) = parse_provider(doc, "acme.toml").values()
    assert op.contract.replay is not None
    assert (op.contract.replay.header, op.contract.replay.retention_s) == (
        "Idempotency-Key", 86400.0)


def test_the_shipped_definitions_declare_todays_status_semantics() -> None:
    operations, _ = load_definitions()
    for op in operations.values():
        contract = op.contract
        assert contract.accepted_statuses == R2XX
        assert contract.not_applied_statuses == {429}
        assert contract.rejected_statuses == R4XX - {429}
        # No shipped provider honours an idempotency key: none claims replay safety.
        assert contract.replay is None


@pytest.mark.parametrize(
    ("provider", "source", "key"),
    [("acme", "other.toml", "providers/other.toml"), (None, "x.toml", "providers/x.toml.provider"),
     ("Acme!", "x.toml", "providers/x.toml.provider")],
)
def test_the_provider_name_must_match_its_file(provider: Any, source: str, key: str) -> None:
    doc = base()
    doc["provider"] = provider
    with pytest.raises(CatalogError) as caught:
        parse_provider(doc, source)
    assert caught.value.key == key


def test_parse_provider_is_pure_over_the_document() -> None:
    doc = base()
    before = copy.deepcopy(doc)
    assert parse_provider(doc) == parse_provider(copy.deepcopy(doc))
    assert doc == before


BINDING = BindingSettings(binding_id="b", provider="x", org_id="o", app_installation_id="i",
                          remote_account_id="r", base_url="http://127.0.0.1:9/")


def _shipped(name: str) -> dict[str, Any]:
    text = resources.files("config").joinpath("providers", name).read_text()
    return tomllib.loads(text)


def test_the_hubspot_definition_builds_exactly_the_request_it_always_sent() -> None:
    operations, _ = load_definitions()
    op = operations["hubspot.contact.update_jobtitle"]
    prepared = prepare(op, BINDING, "101", {"properties": {"jobtitle": "CTO"}}, "cmd-1")
    assert (prepared.method, prepared.url, prepared.path) == (
        "PATCH", "http://127.0.0.1:9/crm/v3/objects/contacts/101",
        "/crm/v3/objects/contacts/101")
    assert prepared.body == b'{"properties":{"jobtitle":"CTO"}}'
    assert prepared.safe_headers == {"Content-Type": "application/json",
                                     "Idempotency-Key": "cmd-1"}
    assert prepared.desired == {"jobtitle": "CTO"}
    assert (prepared.auth.header, prepared.auth.prefix) == ("Authorization", "Bearer ")
    assert op.read is not None
    assert op.read.path.render(remote_id="101", field_names=["jobtitle"]) == (
        "/crm/v3/objects/contacts/101?properties=jobtitle")


def test_the_outreach_definition_builds_a_json_api_patch() -> None:
    operations, _ = load_definitions()
    op = operations["outreach.prospect.update_title"]
    prepared = prepare(op, BINDING, "42", {"attributes": {"title": "CTO"}}, "cmd-1")
    assert (prepared.method, prepared.path) == ("PATCH", "/api/v2/prospects/42")
    assert prepared.body == (
        b'{"data":{"attributes":{"title":"CTO"},"id":42,"type":"prospect"}}')
    assert prepared.safe_headers == {"Content-Type": "application/vnd.api+json"}
    with pytest.raises(BadRequestForOperation, match="not an integer"):
        prepare(op, BINDING, "p-42", {"attributes": {"title": "CTO"}}, "cmd-1")


@pytest.mark.parametrize(
    ("name", "request_doc", "says"),
    [
        ("hubspot.contact.update_jobtitle", {"attributes": {"jobtitle": "x"}},
         "request.properties must be a non-empty object"),
        ("hubspot.contact.update_jobtitle", {"properties": {"email": "x"}},
         "not allowed by the operation: email"),
        ("outreach.prospect.update_title", {"properties": {"title": "x"}},
         "request.attributes must be a non-empty object"),
        ("outreach.prospect.update_title", {"attributes": {"title": 3}},
         "strings or null"),
    ],
)
def test_a_command_that_does_not_fit_the_definition(name: str, request_doc: Any,
                                                    says: str) -> None:
    operations, _ = load_definitions()
    with pytest.raises(BadRequestForOperation, match=says):
        desired_fields(operations[name], request_doc)


def test_every_shipped_definition_parses_on_its_own() -> None:
    for name in ("hubspot.toml", "outreach.toml"):
        assert parse_provider(_shipped(name), name)
