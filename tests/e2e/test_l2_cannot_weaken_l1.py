"""L2 cannot weaken L1 (issue 8, item 8): a binding may only lengthen the windows
its provider's L1 definition declares. Real ``integrationd check-config`` processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.processes import run_cli

BINDING = """
[[bindings]]
binding_id = "hubspot-main"
provider = "hubspot"
org_id = "org-acme"
app_installation_id = "install-1"
remote_account_id = "portal-1"
base_url = "http://127.0.0.1:9"
"""


@pytest.mark.parametrize(("setting", "key", "message"), [
    ("max_in_flight = 1.0", "bindings[0].max_in_flight",
     "1 s is shorter than the 30 s L1 declares for hubspot.contact.update_jobtitle;"
     " L2 may only lengthen it"),
    ("max_clock_skew = 0.1", "bindings[0].max_clock_skew",
     "0.1 s is shorter than the 2 s L1 declares for hubspot.contact.update_jobtitle;"
     " L2 may only lengthen it"),
    ("max_in_flight = -5.0", "bindings[0].max_in_flight", "must not be negative, got -5.0"),
])
def test_a_binding_that_shortens_l1_is_a_one_line_error(tmp_path: Path, setting: str, key: str,
                                                         message: str) -> None:
    cfg = tmp_path / "weaker.toml"
    cfg.write_text(BINDING + setting + "\n")
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"integrationd: config error: {key}: {message}"]


@pytest.mark.parametrize("setting", ["", "max_in_flight = 30.0", "max_in_flight = 45.0",
                                     "max_clock_skew = 5.0"])
def test_a_binding_may_lengthen_l1(tmp_path: Path, setting: str) -> None:
    cfg = tmp_path / "longer.toml"
    cfg.write_text(BINDING + setting + "\n")
    result = run_cli(cfg, "check-config")
    assert result.returncode == 0, result.stderr


def test_a_missing_definitions_dir_is_a_one_line_error(tmp_path: Path) -> None:
    cfg = tmp_path / "nodir.toml"
    cfg.write_text(f'[catalog]\ndefinitions_dir = "{tmp_path / "absent"}"\n' + BINDING)
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("integrationd: config error: catalog.definitions_dir: no such"
                           " directory")
