"""[[legacy_claimants]]: the adapter the cutover proves a legacy owner through. Every
mistake is one error naming its key; the shipped example is the sandbox's adapter."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from config.load import ConfigError, parse_settings
from daemon.services.families import known_family_names
from sandbox.legacy.store import CLAIMANT_SQL, claimant_settings
from tests.support.processes import run_cli

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "example.toml"
GOOD: dict[str, Any] = {"family": "noop", "adapter": "sql", **CLAIMANT_SQL}


def _load(*tables: dict[str, Any]) -> Any:
    return parse_settings({"legacy_claimants": list(tables)}, environ={},
                          known_families=known_family_names())


def test_a_declared_claimant_loads_as_written() -> None:
    (c,) = _load(GOOD | {"lock_sql": CLAIMANT_SQL["lock_sql"] + ";"}).legacy_claimants
    assert c == claimant_settings("noop")  # a trailing ';' is dropped, nothing else


def test_the_example_declares_the_sandbox_claimant() -> None:
    raw = tomllib.loads(EXAMPLE.read_text())
    (c,) = _load(*raw["legacy_claimants"]).legacy_claimants
    assert c == claimant_settings("noop")


@pytest.mark.parametrize(("change", "key", "says"), [
    ({"family": "nope"}, "legacy_claimants[0].family", "unknown work family 'nope'"),
    ({"adapter": "rest"}, "legacy_claimants[0].adapter", "unknown adapter 'rest'"),
    ({"lock_sql": ""}, "legacy_claimants[0].lock_sql", "is required"),
    ({"processing_sql": "  "}, "legacy_claimants[0].processing_sql", "is required"),
    ({"lock_sql": "SELECT 1 FROM legacy_events WHERE family = :family"},
     "legacy_claimants[0].lock_sql", "expected one UPDATE statement"),
    ({"uncovered_sql": "DELETE FROM legacy_events"}, "legacy_claimants[0].uncovered_sql",
     "expected one SELECT statement"),
    ({"processing_sql": "SELECT COUNT(*) FROM e WHERE family = ?"},
     "legacy_claimants[0].processing_sql", "no '?' placeholders"),
    ({"processing_sql": "SELECT COUNT(*) FROM e WHERE family = :fam"},
     "legacy_claimants[0].processing_sql", "unknown parameter :fam"),
    ({"processes_sql": "SELECT p FROM x; DROP TABLE work_items"},
     "legacy_claimants[0].processes_sql", "no ';' inside"),
    ({"lock_sql": "UPDATE legacy_events SET probe_version = 1"},
     "legacy_claimants[0].lock_sql", "must name the family"),
    ({"lock_sql": 7}, "legacy_claimants[0].lock_sql", "expected a string"),
    ({"owner": "x"}, "legacy_claimants[0].owner", "unknown setting"),
])
def test_each_mistake_names_its_key(change: dict[str, Any], key: str, says: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _load(GOOD | change)
    assert exc.value.key == key
    assert says in str(exc.value)


def test_a_family_has_one_legacy_claimant() -> None:
    with pytest.raises(ConfigError) as exc:
        _load(GOOD, GOOD)
    assert exc.value.key == "legacy_claimants[1].family"


def test_not_an_array_of_tables() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_settings({"legacy_claimants": {"family": "noop"}}, environ={},
                       known_families=known_family_names())
    assert exc.value.key == "legacy_claimants"


def test_check_config_refuses_in_one_line_with_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[[legacy_claimants]]\nfamily = "noop"\nlock_sql = "UPDATE t SET v = 1'
                   ' WHERE f = :family"\nprocessing_sql = "SELECT 1"\n')
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "integrationd: config error: legacy_claimants[0].uncovered_sql: is required (see"
        ' docs/operations.md, "Your legacy claimant")']
