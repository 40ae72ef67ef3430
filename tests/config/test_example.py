"""config/example.toml lists every key the loader reads (set, or commented out with its
default), and it loads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from config.load import _SECTIONS
from config.settings import (
    BindingSettings,
    FamilySettings,
    LegacyClaimantSettings,
    Operator,
    RuntimeClient,
    WebhookRoute,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "example.toml"
# Every section the loader reads, and one table of each array (families by example).
SECTIONS: dict[str, type[Any]] = {
    **_SECTIONS, "families.noop": FamilySettings, "runtimes": RuntimeClient,
    "bindings": BindingSettings, "operators": Operator, "webhook_routes": WebhookRoute,
    "legacy_claimants": LegacyClaimantSettings,
}
_HEADER = re.compile(r"^\[\[?([a-z_.]+)\]\]?\s*$")
_KEY = re.compile(r"^#?\s*([a-z0-9_]+)\s*=")


def _keys_by_section() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    section = ""
    for line in EXAMPLE.read_text().splitlines():
        header = _HEADER.match(line.strip())
        if header:
            section = header.group(1)
            found.setdefault(section, set())
            continue
        key = _KEY.match(line.strip())
        if key and section:
            found[section].add(key.group(1))
    return found


def _expected(cls: type[Any]) -> set[str]:
    names = set()
    for field in attrs.fields(cls):
        # A secret is configured through its *_file key (or a credential), never inline.
        names.add(f"{field.name}_file" if "Secret" in str(field.type) else field.name)
    if cls is Operator:
        names.add("password_hash_file")
    return names


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_example_config_lists_every_key(section: str) -> None:
    listed = _keys_by_section().get(section, set())
    assert _expected(SECTIONS[section]) - listed == set()

