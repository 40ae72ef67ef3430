"""L1 resources and L2 object bindings as data: the shipped Prospect resource and Lead
binding, every mapped field owned by exactly one direction, bad input one line naming the
key (``check-config`` exits 2)."""

from __future__ import annotations

import copy
import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from config.catalog import build_catalog, load_catalog, load_definitions
from config.catalog_revisions import catalog_from_content
from config.definitions import CatalogError, parse_object_binding, parse_provider, parse_resources
from config.settings import CatalogSettings, Settings
from daemon.core.catalog_content import parse_content
from tests.support.processes import run_cli


def shipped(folder: str, name: str) -> dict[str, Any]:
    text = resources.files("config").joinpath(folder).joinpath(name).read_text()
    return tomllib.loads(text)


def lead() -> dict[str, Any]:
    return shipped("bindings", "outreach_lead.toml")


def outreach() -> dict[str, Any]:
    return shipped("providers", "outreach.toml")


def check(doc: dict[str, Any]) -> None:
    operations, documents = load_definitions()
    resources_ = {f"{r.provider}.{r.name}": r for d in documents
                  for r in parse_resources(d).values()}
    parse_object_binding(doc, "outreach_lead.toml", resources_, operations)


def test_the_shipped_catalog_holds_the_prospect_resource_and_the_lead_binding() -> None:
    catalog = load_catalog(Settings())
    prospect = catalog.resource("outreach", "prospect")
    assert prospect is not None and prospect.list is not None
    assert (prospect.type, prospect.id_kind) == ("prospect", "integer")
    assert prospect.event_kind("prospect.destroyed") == "destroyed"
    assert prospect.event_kind("prospect.merged") is None
    assert prospect.get.path.render(remote_id="42") == "/api/v2/prospects/42"
    assert (prospect.list.since_param, prospect.list.since_format) == (
        "filter[updatedAt]", "{since}..inf")
    assert dict(prospect.list.query) == {"sort": "updatedAt"}
    binding = catalog.object_binding("outreach_lead")
    assert binding is not None
    assert binding.inbound_remote() == {"firstName": "FirstName", "lastName": "LastName",
                                        "company": "Company"}
    assert [(f.remote, f.local) for f in binding.owned("outbound")] == [("title", "Title")]
    assert binding.match == ("emails", "Email")
    assert (binding.reconcile.interval_s, binding.reconcile.overlap_s,
            binding.reconcile.safety_lag_s, binding.reconcile.page_size) == (
        300.0, 120.0, 30.0, 100)


def test_the_stored_revision_carries_the_object_bindings_and_parses_back() -> None:
    catalog = load_catalog(Settings(catalog=CatalogSettings(revision=4)))
    again = catalog_from_content(4, catalog.digest, catalog.content)
    assert again.object_bindings == catalog.object_bindings
    assert again.resources == catalog.resources


def test_a_catalog_without_object_bindings_keeps_the_old_content_shape() -> None:
    _, documents = load_definitions()
    catalog = build_catalog(1, documents, ())
    assert catalog.object_bindings == ()
    assert set(json.loads(catalog.content)) == {"bindings", "definitions"}
    assert parse_content(catalog.content) == (documents, [])


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target = out
    for part in path[:-1]:
        target = target.setdefault(part, {})
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


KEY = "object_bindings.outreach_lead"


@pytest.mark.parametrize(("path", "value", "key", "says"), [
    (("outbound", "firstName"), "FirstName", f"{KEY}.inbound.firstName",
     "mapped in both directions"),
    (("inbound", "title"), "Title", f"{KEY}.inbound.title", "mapped in both directions"),
    (("inbound", "shoeSize"), "ShoeSize", f"{KEY}.inbound.shoeSize",
     "unknown field of outreach.prospect"),
    (("outbound", "company"), "Employer", f"{KEY}.inbound.company",
     "mapped in both directions"),
    (("outbound", "stage"), "Stage", f"{KEY}.outbound.stage",
     "no outreach operation on prospect may write it"),
    (("inbound", "phone"), "FirstName", KEY, "local field 'FirstName' is mapped twice"),
    (("inbound", "phone"), 7, f"{KEY}.inbound.phone", "expected the local field name"),
    (("resource",), "account", f"{KEY}.resource", "no L1 resource 'account'"),
    (("match", "remote"), "email", f"{KEY}.match.remote", "unknown field"),
    (("colour",), "red", f"{KEY}.colour", "unknown key"),
    (("reconcile", "page_size"), 5000, f"{KEY}.reconcile.page_size",
     "above the L1 max_page_size 1000"),
    (("reconcile", "interval"), 0, f"{KEY}.reconcile.interval", "positive"),
    (("reconcile", "overlap"), -1, f"{KEY}.reconcile.overlap", "non-negative"),
    (("reconcile", "every"), 5, f"{KEY}.reconcile.every", "unknown key"),
    (("local_object",), None, f"{KEY}.local_object", "missing"),
])
def test_a_bad_object_binding_names_the_key(path: tuple[str, ...], value: Any, key: str,
                                            says: str) -> None:
    with pytest.raises(CatalogError) as caught:
        check(_set(lead(), path, value))
    assert caught.value.key == key
    assert says in str(caught.value)


def test_the_file_name_must_match_the_binding_name() -> None:
    with pytest.raises(CatalogError, match="name must match the file name"):
        parse_object_binding(lead(), "other.toml")


RES = "providers.outreach.resources.prospect"


@pytest.mark.parametrize(("path", "value", "key", "says"), [
    (("id_kind",), "uuid", f"{RES}.id_kind", "expected one of integer, string"),
    (("events", "prospect.merged"), "merged", f"{RES}.events.prospect.merged",
     "expected one of created, destroyed, updated"),
    (("get",), None, f"{RES}.get", "missing"),
    (("get", "updated_at"), "data/attributes", f"{RES}.get.updated_at", "malformed JSON pointer"),
    (("list", "path"), "/api/v2/prospects?x=1", f"{RES}.list.path", "plain path"),
    (("list", "since_format"), "..inf", f"{RES}.list.since_format", "{since}"),
    (("list", "page_size"), 5000, f"{RES}.list.page_size", "above max_page_size"),
    (("list", "page_size"), 0, f"{RES}.list.page_size", "positive integer"),
    (("list", "auth"), "oauth", f"{RES}.list.auth", "no auth scheme 'oauth'"),
    (("fields",), [], f"{RES}.fields", "at least one"),
])
def test_a_bad_resource_names_the_key(path: tuple[str, ...], value: Any, key: str,
                                      says: str) -> None:
    doc = outreach()
    doc["resources"]["prospect"] = _set(doc["resources"]["prospect"], path, value)
    with pytest.raises(CatalogError) as caught:
        parse_provider(doc, "outreach.toml")
    assert caught.value.key == key
    assert says in str(caught.value)


def test_check_config_exits_2_with_one_line_for_a_field_in_both_directions(
        tmp_path: Path) -> None:
    folder = tmp_path / "bindings"
    folder.mkdir()
    text = resources.files("config").joinpath("bindings/outreach_lead.toml").read_text()
    assert 'title = "Title"' in text
    text = text.replace('company = "Company"', 'company = "Company"\ntitle = "Title"', 1)
    (folder / "outreach_lead.toml").write_text(text)
    cfg = tmp_path / "integrationd.toml"
    cfg.write_text(f'[catalog]\nrevision = 3\nobject_bindings_dir = "{folder}"\n')
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2, result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"integrationd: config error: {KEY}.inbound.title: mapped in both")


def test_check_config_names_a_missing_object_bindings_dir(tmp_path: Path) -> None:
    cfg = tmp_path / "integrationd.toml"
    cfg.write_text(f'[catalog]\nrevision = 3\nobject_bindings_dir = "{tmp_path / "no"}"\n')
    result = run_cli(cfg, "check-config")
    assert result.returncode == 2
    assert "catalog.object_bindings_dir: no such directory" in result.stderr
