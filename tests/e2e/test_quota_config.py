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
    declared = {(op.provider, q.name, q.limit, q.window_s, q.scope, q.kind,
                 tuple(sorted(q.endpoint_classes)), q.reset_header, q.reset_format)
                for op in operations.values() for q in op.quotas}
    assert declared == {
        ("hubspot", "search", 4, 1.0, "binding", "sliding", ("search",), "", ""),
        ("hubspot", "per_app_10s", 100, 10.0, "app_installation", "sliding", (), "", ""),
        ("hubspot", "per_app_day", 250_000, 86_400.0, "app_installation", "sliding", (),
         "", ""),
        ("outreach", "per_user_hour", 10_000, 3600.0, "binding", "sliding", (),
         "x-ratelimit-reset", "seconds"),
    }
    hubspot = operations["hubspot.contact.update_jobtitle"]
    assert hubspot.endpoint_class == "crm_objects"
    assert hubspot.provider_classes == {"crm_objects", "search"}
    # A burst, and a sustained rate of at least 90 % of the limit, for every dimension
    # the PATCH counts against (the search limit counts only search calls).
    for q in hubspot.quotas:
        if q.name == "search":
            continue
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


def test_a_clock_spread_a_fixed_window_cannot_hold_is_a_one_line_error(tmp_path: Path) -> None:
    """A fixed window must outlast its jitter plus the replicas' clock spread: a spread
    that leaves no room is refused at check-config, naming the setting and the dimension,
    not found at the first dispatch."""
    l1 = write_sandbox_definitions(tmp_path / "l1")
    hubspot = l1 / "hubspot.toml"
    text = hubspot.read_text()
    sliding = 'window = 1.0\nscope = "binding"\nkind = "sliding"\n'
    assert text.count(sliding) == 1
    hubspot.write_text(text.replace(sliding, 'window = 1.0\nscope = "binding"\nkind = "fixed"\n'))
    cfg = tmp_path / "spread.toml"
    base = f'[catalog]\ndefinitions_dir = "{l1}"\n' + BINDING
    cfg.write_text(base)
    assert run_cli(cfg, "check-config").returncode == 0  # the fixed window itself is fine
    cfg.write_text("[work]\nclock_spread = 0.8\n" + base)
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("integrationd: config error: work.clock_spread: hubspot quota"
                           " search: a fixed window must be longer than the jitter and the"
                           " clock spread"), line


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
     "hubspot's L1 declares no such quota dimension (declared: per_app_10s, per_app_day,"
     " search)"),
    # Endpoint classes an override names must be ones the dimension counts.
    ('[bindings.quota.per_app_10s]\nendpoint_classes = ["searches"]\n',
     "bindings[0].quota.per_app_10s.endpoint_classes",
     "unknown endpoint class 'searches' (hubspot's per_app_10s counts: crm_objects, search)"),
    ('[bindings.quota.search]\nendpoint_classes = ["crm_objects"]\n',
     "bindings[0].quota.search.endpoint_classes",
     "unknown endpoint class 'crm_objects' (hubspot's search counts: search)"),
    ('[bindings.quota.per_app_10s]\nendpoint_classes = []\n',
     "bindings[0].quota.per_app_10s.endpoint_classes", "expected a list of endpoint classes"),
    ('[bindings.quota.per_app_10s]\nendpoint_classes = "search"\n',
     "bindings[0].quota.per_app_10s.endpoint_classes", "expected a list of endpoint classes"),
    ('[bindings.quota.per_app_10s]\nkey = "x"\n',
     "bindings[0].quota.per_app_10s.scope", "expected one of"),
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
    # The PATCH's class (crm_objects) given a budget of its own, L1's scope kept.
    ('[bindings.quota.per_app_10s]\nendpoint_classes = ["crm_objects"]\n',
     ["hubspot:per_app_10s:org-acme:install-1:class:crm_objects",
      "hubspot:per_app_day:org-acme:install-1"]),
    # Only search calls apart: the PATCH keeps the common budget.
    ('[bindings.quota.per_app_10s]\nendpoint_classes = ["search"]\n',
     ["hubspot:per_app_10s:org-acme:install-1", "hubspot:per_app_day:org-acme:install-1"]),
    ('[bindings.quota.per_app_10s]\nscope = "org"\nendpoint_classes = ["crm_objects"]\n',
     ["hubspot:per_app_10s:org-acme:class:crm_objects",
      "hubspot:per_app_day:org-acme:install-1"]),
])
def test_an_l2_scope_override_names_the_key_the_dimension_counts_against(
        tmp_path: Path, override: str, keys: list[str]) -> None:
    cfg = tmp_path / "scope.toml"
    cfg.write_text(BINDING + override)
    assert run_cli(cfg, "check-config").returncode == 0
    settings = load_settings(str(cfg), environ={}, known_families=known_family_names())
    operations, _ = load_definitions(str(Path("config/providers")))
    (binding,) = settings.bindings
    got = quota_keys(operations["hubspot.contact.update_jobtitle"], binding,
                     clock_spread_us=settings.work.clock_spread_us)
    assert [k.key for k in got] == keys


@pytest.mark.parametrize(("edit", "key", "message"), [
    # An operation of a class the provider does not declare.
    (('endpoint_class = "crm_objects"', 'endpoint_class = "crm"'),
     "providers.hubspot.operations.hubspot.contact.update_jobtitle.endpoint_class",
     "unknown endpoint class 'crm' (the provider's endpoint_classes: crm_objects, search)"),
    # A dimension counting a class the provider does not declare.
    (('endpoint_classes = ["search"]', 'endpoint_classes = ["serach"]'),
     "providers.hubspot.quota.search.endpoint_classes", "unknown endpoint class 'serach'"),
    (('endpoint_classes = ["search"]', 'endpoint_classes = []'),
     "providers.hubspot.quota.search.endpoint_classes", "expected at least one entry"),
    (('endpoint_classes = ["search"]', 'per_endpoint_class = "yes"'),
     "providers.hubspot.quota.search.per_endpoint_class", "expected true or false"),
    # The provider's own list.
    (('endpoint_classes = ["crm_objects", "search"]', 'endpoint_classes = ["Search"]'),
     "providers.hubspot.endpoint_classes", "'Search': expected a lower-case name"),
    (('endpoint_classes = ["crm_objects", "search"]',
      'endpoint_classes = ["crm_objects", "search", "search"]'),
     "providers.hubspot.endpoint_classes", "a class is named twice"),
    (('endpoint_classes = ["crm_objects", "search"]', 'endpoint_classes = "search"'),
     "providers.hubspot.endpoint_classes", "expected a list of non-empty strings"),
    # A reset header names its format, and a format names a header.
    (('remaining_header = "x-hubspot-ratelimit-remaining"',
      'remaining_header = "x-hubspot-ratelimit-remaining"\nreset_header = "x-reset"'),
     "providers.hubspot.quota.per_app_10s.reset_format",
     "expected one of seconds, epoch_seconds, epoch_ms, got ''"),
    (('remaining_header = "x-hubspot-ratelimit-remaining"',
      'reset_header = "x-reset"\nreset_format = "minutes"'),
     "providers.hubspot.quota.per_app_10s.reset_format",
     "expected one of seconds, epoch_seconds, epoch_ms, got 'minutes'"),
    (('remaining_header = "x-hubspot-ratelimit-remaining"', 'reset_format = "seconds"'),
     "providers.hubspot.quota.per_app_10s.reset_format", "names the format of no reset_header"),
    (('remaining_header = "x-hubspot-ratelimit-remaining"', 'reset_header = "x reset"'),
     "providers.hubspot.quota.per_app_10s.reset_header", "expected a header name"),
])
def test_a_bad_endpoint_class_or_reset_header_in_l1_is_a_one_line_error(
        tmp_path: Path, edit: tuple[str, str], key: str, message: str) -> None:
    l1 = write_sandbox_definitions(tmp_path / "l1")
    hubspot = l1 / "hubspot.toml"
    text = hubspot.read_text()
    old, new = edit
    assert text.count(old + "\n") == 1, old
    hubspot.write_text(text.replace(old + "\n", new + "\n"))
    cfg = tmp_path / "bad.toml"
    cfg.write_text(f'[catalog]\ndefinitions_dir = "{l1}"\n' + BINDING)
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"integrationd: config error: {key}: {message}"), line
