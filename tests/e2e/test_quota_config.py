"""Quota as configuration (issue 9 items 5 and 6): the shipped L1 files declare their
limits as data, a limit that cannot be enforced is one line naming the key (exit 2), and
an L2 binding may count an L1 dimension against another scope. Real ``integrationd
check-config`` processes; the key names come from the effect path's own function."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.catalog import load_definitions
from config.load import load_settings
from daemon.services.effect_quota import quota_keys
from daemon.services.families import known_family_names
from tests.support.l1 import write_sandbox_definitions
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


def test_the_shipped_l1_files_declare_their_quota() -> None:
    operations, _ = load_definitions(str(Path("config/providers")))
    declared = {(op.provider, q.name, q.limit, q.window_s, q.scope, q.kind)
                for op in operations.values() for q in op.quotas}
    assert declared == {
        ("hubspot", "per_app_10s", 100, 10.0, "app_installation", "sliding"),
        ("hubspot", "per_app_day", 250_000, 86_400.0, "app_installation", "sliding"),
        ("outreach", "per_user_hour", 10_000, 3600.0, "binding", "sliding"),
    }
    hubspot = operations["hubspot.contact.update_jobtitle"]
    # A burst, and a sustained rate of at least 90 % of the limit.
    for q in hubspot.quotas:
        assert q.burst > 1 and q.remaining_header.startswith("x-hubspot-ratelimit")


@pytest.mark.parametrize(("setting", "key", "message"), [
    ("limit = 0", "providers.hubspot.quota.per_app_10s.limit",
     "must be a positive integer, got 0"),
    ("limit = -100", "providers.hubspot.quota.per_app_10s.limit",
     "must be a positive integer, got -100"),
])
def test_a_zero_or_negative_shipped_limit_is_a_one_line_error(tmp_path: Path, setting: str,
                                                              key: str, message: str) -> None:
    l1 = write_sandbox_definitions(tmp_path / "l1")
    hubspot = l1 / "hubspot.toml"
    text = hubspot.read_text()
    assert text.count("limit = 100\n") == 1
    hubspot.write_text(text.replace("limit = 100\n", setting + "\n"))
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[catalog]\ndefinitions_dir = "{l1}"\n' + BINDING)
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"integrationd: config error: {key}: {message}"), line


@pytest.mark.parametrize(("override", "key", "message"), [
    ('[bindings.quota.per_app_10s]\nscope = "galaxy"\n',
     "bindings[0].quota.per_app_10s.scope",
     "expected one of app_installation, binding, org, provider_key, got 'galaxy'"),
    ('[bindings.quota.per_app_10s]\nscope = "provider_key"\n',
     "bindings[0].quota.per_app_10s.key", "a provider quota key (text) is named exactly"),
    ('[bindings.quota.per_app_10s]\nscope = "org"\nkey = "x"\n',
     "bindings[0].quota.per_app_10s.key", "a provider quota key (text) is named exactly"),
    ('[bindings.quota.per_app_10s]\nscope = "provider_key"\nkey = "a b:c"\n',
     "bindings[0].quota.per_app_10s.key", "expected letters, digits"),
    ('[bindings.quota.per_app_10s]\nscope = "org"\nlimit = 5\n',
     "bindings[0].quota.per_app_10s.limit", "unknown setting"),
    ('[bindings.quota.per_minute]\nscope = "org"\n',
     "bindings[0].quota.per_minute",
     "hubspot's L1 declares no such quota dimension (declared: per_app_10s, per_app_day)"),
    ('[bindings.quota]\nper_app_10s = "org"\n',
     "bindings[0].quota.per_app_10s", "expected a table with scope (and key)"),
])
def test_an_invalid_l2_quota_scope_is_a_one_line_error(tmp_path: Path, override: str,
                                                       key: str, message: str) -> None:
    cfg = tmp_path / "scope.toml"
    cfg.write_text(BINDING + override)
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"integrationd: config error: {key}: {message}"), line


@pytest.mark.parametrize(("override", "keys"), [
    ("", ["hubspot:per_app_10s:org-acme:install-1", "hubspot:per_app_day:org-acme:install-1"]),
    ('[bindings.quota.per_app_10s]\nscope = "org"\n',
     ["hubspot:per_app_10s:org-acme", "hubspot:per_app_day:org-acme:install-1"]),
    ('[bindings.quota.per_app_day]\nscope = "binding"\n',
     ["hubspot:per_app_10s:org-acme:install-1", "hubspot:per_app_day:org-acme:hubspot-main"]),
    ('[bindings.quota.per_app_10s]\nscope = "provider_key"\nkey = "shared-app-7"\n',
     ["hubspot:per_app_10s:key:shared-app-7", "hubspot:per_app_day:org-acme:install-1"]),
])
def test_an_l2_scope_override_names_the_key_the_dimension_counts_against(
        tmp_path: Path, override: str, keys: list[str]) -> None:
    cfg = tmp_path / "scope.toml"
    cfg.write_text(BINDING + override)
    assert run_cli(cfg, "check-config").returncode == 0
    settings = load_settings(str(cfg), environ={}, known_families=known_family_names())
    operations, _ = load_definitions(str(Path("config/providers")))
    (binding,) = settings.bindings
    got = quota_keys(operations["hubspot.contact.update_jobtitle"], binding)
    assert [k.key for k in got] == keys
