"""The settings loader: partial overrides change only their key, values keep their types.

Synchronous and table-driven; every row goes through ``parse_settings``, the function the CLI
uses, with an explicit environment.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from config.load import ConfigError, parse_settings
from config.settings import FAMILY_DEFAULTS, FamilySettings, Settings

FAMILIES = tuple(FAMILY_DEFAULTS)


def _parse(raw: dict[str, Any], environ: dict[str, str] | None = None) -> Settings:
    return parse_settings(raw, environ=environ or {}, known_families=FAMILIES)


def _other_value(name: str, value: Any) -> Any:
    """A valid value for ``name`` that differs from ``value``."""
    if name == "backoff_cap":
        return value + 7.0
    if name == "backoff_base":
        return 0.5 if value != 0.5 else 0.25
    if name == "lease_ttl":
        return value + 11.0
    return value + 3


FIELDS = [f.name for f in attrs.fields(FamilySettings)]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("field", FIELDS)
def test_partial_family_table_changes_only_that_key(family: str, field: str) -> None:
    base = FAMILY_DEFAULTS[family]
    new = _other_value(field, getattr(base, field))
    got = _parse({"families": {family: {field: new}}}).family(family)
    assert got == attrs.evolve(base, **{field: new})


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("field", FIELDS)
def test_partial_family_environment_override_changes_only_that_key(
        family: str, field: str) -> None:
    base = FAMILY_DEFAULTS[family]
    new = _other_value(field, getattr(base, field))
    env = {f"INTEGRATIOND__FAMILIES__{family.upper()}__{field.upper()}": str(new)}
    assert _parse({}, env).family(family) == attrs.evolve(base, **{field: new})


def test_receipt_backoff_cap_override_keeps_receipts_retried_until_confirmed() -> None:
    """The finding: `backoff_cap = 10` dropped max_attempts from 1,000,000 to 5."""
    got = _parse({"families": {"runtime_receipt": {"backoff_cap": 10}}}).family("runtime_receipt")
    assert got.max_attempts == 1_000_000
    assert got.backoff_cap == 10.0


def test_one_noop_key_keeps_noop_batch_size() -> None:
    """The finding: one noop key halved batch_size (128 -> 64)."""
    assert _parse({"families": {"noop": {"max_attempts": 3}}}).family("noop").batch_size == 128


def test_partial_family_table_is_validated_against_merged_values() -> None:
    # backoff_base above the built-in cap (60 for runtime_receipt) is refused by name.
    with pytest.raises(ConfigError, match=r"^families\.runtime_receipt\.backoff_cap: "):
        _parse({"families": {"runtime_receipt": {"backoff_base": 120}}})


BAD_TYPES = [
    # (section, key, TOML value, message fragment)
    ("families.noop", "max_attempts", 2.5, "expected an integer"),
    ("families.noop", "max_attempts", 2.0, "expected an integer"),
    ("families.noop", "max_attempts", "3", "expected an integer"),
    ("families.noop", "max_attempts", True, "expected an integer"),
    ("work", "poll_interval", "0.25", "expected a number"),
    ("work", "poll_interval", True, "expected a number"),
    ("work", "concurrency", 1.5, "expected an integer"),
    ("storage", "pool_size", "8", "expected an integer"),
    ("storage", "url", 5, "expected a string"),
    ("api", "max_body_bytes", 1e6, "expected an integer"),
]


def _nest(section: str, key: str, value: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {key: value}
    for part in reversed(section.split(".")):
        raw = {part: raw}
    return raw


@pytest.mark.parametrize(("section", "key", "value", "message"), BAD_TYPES)
def test_toml_value_of_the_wrong_type_is_refused_naming_the_key(
        section: str, key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse(_nest(section, key, value))
    assert str(info.value).startswith(f"{section}.{key}: {message}")


GOOD_ENV = [
    ("INTEGRATIOND__WORK__POLL_INTERVAL", "0.5", lambda s: s.work.poll_interval == 0.5),
    ("INTEGRATIOND__WORK__CONCURRENCY", "12", lambda s: s.work.concurrency == 12),
    ("INTEGRATIOND__STORAGE__POOL_SIZE", " 4 ", lambda s: s.storage.pool_size == 4),
    ("INTEGRATIOND__REPLICA__DRAIN_TIMEOUT", "7", lambda s: s.replica.drain_timeout == 7.0),
]


@pytest.mark.parametrize(("name", "text", "check"), GOOD_ENV)
def test_environment_text_is_parsed_as_the_key_type(name: str, text: str, check: Any) -> None:
    assert check(_parse({}, {name: text}))


BAD_ENV = [
    ("INTEGRATIOND__FAMILIES__NOOP__MAX_ATTEMPTS", "2.5", "families.noop.max_attempts",
     "expected an integer"),
    ("INTEGRATIOND__WORK__CONCURRENCY", "1e3", "work.concurrency", "expected an integer"),
    ("INTEGRATIOND__WORK__POLL_INTERVAL", "fast", "work.poll_interval", "expected a number"),
    ("INTEGRATIOND__WORK__POLL_INTERVAL", "nan", "work.poll_interval", "expected a number"),
    ("INTEGRATIOND__WORK__POLL_INTERVAL", "inf", "work.poll_interval", "expected a number"),
]


@pytest.mark.parametrize(("name", "text", "key", "message"), BAD_ENV)
def test_bad_environment_text_is_refused_naming_the_key(
        name: str, text: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse({}, {name: text})
    assert str(info.value).startswith(f"{key}: {message}")


def test_integer_toml_value_is_accepted_for_a_number_key() -> None:
    assert _parse({"work": {"poll_interval": 1}}).work.poll_interval == 1.0


def test_unknown_family_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^families\.noop\.batchsize: unknown setting"):
        _parse({"families": {"noop": {"batchsize": 3}}})


_BINDING = {"binding_id": "b1", "provider": "p", "org_id": "o", "app_installation_id": "i",
            "remote_account_id": "r", "base_url": "http://127.0.0.1:1"}
_TOKEN_ENV = {"INTEGRATIOND_BINDING_B1_TOKEN": "static-SECRET"}
_CLIENT_ENV = {"INTEGRATIOND_BINDING_B1_CLIENT_SECRET": "client-SECRET"}


@pytest.mark.parametrize(("fields", "environ", "message"), [
    ({}, _TOKEN_ENV, 'bindings[0].auth: this binding has a static token (token_file,'
     ' credential or environment): declare auth = "static_token"'),
    ({"auth": "oauth"}, {}, "bindings[0].auth: expected one of grant, static_token, s2s, got"
     " 'oauth'"),
    ({"auth": "static_token"}, {}, 'bindings[0].token_file: auth = "static_token" needs a'
     ' token'),
    ({"auth": "grant"}, _TOKEN_ENV, 'bindings[0].token_file: auth = "grant" takes its token'
     " from the binding's AuthorizationGrant, never from a file"),
    ({"auth": "grant"}, {}, 'bindings[0].token_url: auth = "grant" needs the OAuth token'
     " endpoint"),
    ({"auth": "grant", "token_url": "https://example.test/token"}, _CLIENT_ENV,
     'bindings[0].client_id: auth = "grant" needs the OAuth client id'),
    ({"auth": "grant", "token_url": "https://example.test/token", "client_id": "c"}, {},
     'bindings[0].client_secret_file: auth = "grant" needs the OAuth client secret'),
    ({"client_secret": "inline"}, {}, "bindings[0].client_secret: "),
])
def test_a_bindings_auth_kind_is_declared_and_complete(
        fields: dict[str, Any], environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse({"bindings": [{**_BINDING, **fields}]}, environ)
    assert str(info.value).startswith(message)


def test_the_auth_kinds_load() -> None:
    static = _parse({"bindings": [{**_BINDING, "auth": "static_token"}]}, _TOKEN_ENV)
    (b,) = static.bindings
    assert (b.auth, b.token is not None) == ("static_token", True)
    grant = _parse({"bindings": [{**_BINDING, "auth": "grant", "client_id": "c",
                                  "token_url": "https://example.test/token"}]}, _CLIENT_ENV)
    (g,) = grant.bindings
    assert (g.auth, g.token, g.client_secret is not None) == ("grant", None, True)
    assert "client-SECRET" not in repr(g)


@pytest.mark.parametrize(("table", "key", "message"), [
    ({"facts_days": 30.0}, "retention.facts_days", "must be longer than retention.work_days"),
    ({"work_days": 500.0}, "retention.facts_days", "must be longer than retention.work_days"),
    ({"work_days": 0.0}, "retention.work_days", "must be positive"),
    # The admission fact deduplicates a handoff key for facts_days: the command (whose
    # handoff_key is unique) may not be forgotten sooner.
    ({"commands_days": 100.0}, "retention.commands_days", "at least retention.facts_days"),
    ({"facts_days": 500.0}, "retention.commands_days", "at least retention.facts_days"),
    ({"quarantine_days": 0.0}, "retention.quarantine_days", "must be positive"),
    ({"batch_rows": 0}, "retention.batch_rows", "must be at least 1"),
    ({"batch_bytes": 200_000_000}, "retention.batch_bytes", "TiDB's 100 MB"),
    ({"interval": 0.0}, "retention.interval", "must be positive"),
    ({"lease_ttl": -1.0}, "retention.lease_ttl", "must be positive"),
])
def test_retention_settings_that_cannot_work_are_refused_by_name(
        table: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse({"retention": table})
    assert info.value.key == key
    assert message in str(info.value)


def test_retention_defaults_keep_facts_longer_than_work() -> None:
    retention = _parse({}).retention
    assert retention.enabled and retention.facts_days > retention.work_days
    assert retention.commands_days >= retention.facts_days


@pytest.mark.parametrize(("value", "message"), [
    (0.0, "must be positive"), (-1.0, "must be positive"),
    (float("inf"), "expected a number, got inf"), ("90", "expected a number"),
])
def test_a_refresh_answer_wait_that_cannot_work_is_refused_by_name(value: object,
                                                                   message: str) -> None:
    assert _parse({}).replica.refresh_answer_wait == 90.0
    assert _parse({"replica": {"refresh_answer_wait": 120}}).replica.refresh_answer_wait == 120
    with pytest.raises(ConfigError) as info:
        _parse({"replica": {"refresh_answer_wait": value}})
    assert info.value.key == "replica.refresh_answer_wait"
    assert message in str(info.value)


@pytest.mark.parametrize(("value", "accepted"), [
    (0.0, True), (0.005, True), (0.1, True),  # off, the default, the most allowed
    (-0.001, False), (0.2, False), (5.0, False),  # a linger of seconds spends lease trust
])
def test_the_finalize_linger_is_milliseconds_or_off(value: float, accepted: bool) -> None:
    assert _parse({}).work.finalize_linger == 0.005
    if accepted:
        assert _parse({"work": {"finalize_linger": value}}).work.finalize_linger == value
        return
    with pytest.raises(ConfigError) as info:
        _parse({"work": {"finalize_linger": value}})
    assert info.value.key == "work.finalize_linger"
    assert "between 0 and 0.1" in str(info.value)


def test_the_replicas_clock_spread_defaults_to_agreeing_clocks_and_is_never_negative() -> None:
    assert _parse({}).work.clock_spread_us == 0
    assert _parse({"work": {"clock_spread": 0.05}}).work.clock_spread_us == 50_000
    with pytest.raises(ConfigError) as info:
        _parse({"work": {"clock_spread": -0.01}})
    assert info.value.key == "work.clock_spread"
    assert "must not be negative" in str(info.value)


_RUNTIME = {"name": "crm", "org_id": "o", "app_installation_id": "i",
            "runtime_capability_id": "c", "runtime_work_binding_digest": "d"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"results_batch_url": "http://127.0.0.1:1/batch"},
     "runtimes[0].results_batch_url: needs results_url too"),
    ({"results_url": "ftp://127.0.0.1/r"}, "runtimes[0].results_url: must be an http:// or"),
    ({"results_url": "http://127.0.0.1:1/r", "results_batch_url": "127.0.0.1:1/batch"},
     "runtimes[0].results_batch_url: must be an http:// or https:// URL"),
])
def test_a_runtimes_result_urls_are_checked_by_name(fields: dict[str, Any],
                                                    message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse({"runtimes": [{**_RUNTIME, **fields}]})
    assert str(info.value).startswith(message)


def test_a_runtimes_batch_route_loads() -> None:
    settings = _parse({"runtimes": [{**_RUNTIME, "results_url": "https://crm.test/r",
                                     "results_batch_url": "https://crm.test/r/batch"}]})
    (runtime,) = settings.runtimes
    assert (runtime.results_url, runtime.results_batch_url) == \
        ("https://crm.test/r", "https://crm.test/r/batch")
