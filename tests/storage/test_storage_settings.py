"""The storage bounds are settings: defaults, overrides and bad values naming the key."""

from __future__ import annotations

import pytest

from config.load import ConfigError, parse_settings

FAMILIES = ("noop",)


def _storage(table: dict[str, object], environ: dict[str, str] | None = None) -> object:
    return parse_settings({"storage": table}, environ=environ or {},
                          known_families=FAMILIES).storage


def test_defaults() -> None:
    storage = parse_settings({}, environ={}, known_families=FAMILIES).storage
    assert (storage.connect_timeout, storage.statement_timeout, storage.startup_timeout,
            storage.migration_timeout) == (5.0, 15.0, 120.0, 3600.0)


@pytest.mark.parametrize(
    ("table", "environ", "field", "value"),
    [
        ({"connect_timeout": 1.5}, {}, "connect_timeout", 1.5),
        ({"statement_timeout": 2}, {}, "statement_timeout", 2.0),
        ({"startup_timeout": 0}, {}, "startup_timeout", 0.0),  # 0: try once
        ({}, {"INTEGRATIOND__STORAGE__STARTUP_TIMEOUT": "30"}, "startup_timeout", 30.0),
        ({"migration_timeout": 7200}, {}, "migration_timeout", 7200.0),
    ],
)
def test_overrides(table: dict[str, object], environ: dict[str, str], field: str,
                   value: float) -> None:
    assert getattr(_storage(table, environ), field) == value


@pytest.mark.parametrize(
    ("table", "key", "message"),
    [
        ({"connect_timeout": 0}, "storage.connect_timeout", "must be positive"),
        ({"connect_timeout": -1.0}, "storage.connect_timeout", "must be positive"),
        ({"statement_timeout": 0.0}, "storage.statement_timeout", "must be positive"),
        ({"startup_timeout": -5}, "storage.startup_timeout", "must not be negative"),
        ({"migration_timeout": 0}, "storage.migration_timeout", "must be positive"),
        ({"migration_timeout": -60.0}, "storage.migration_timeout", "must be positive"),
        ({"statement_timeout": "soon"}, "storage.statement_timeout", "expected a number"),
        ({"connect_timeouts": 1}, "storage.connect_timeouts", "unknown setting"),
    ],
)
def test_bad_values_name_the_key(table: dict[str, object], key: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        _storage(table)
    assert caught.value.key == key
