"""Seed 12 (R6): no provider's name in L0 code. Providers are data in config/providers/.

Greps daemon/, storage/ and admin_ui/ (code, templates, SQL, static files) for
every provider that config/providers/ declares, case-insensitively, comments
included: the simplest rule that cannot drift.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TREES = ("daemon", "storage", "admin_ui")


def declared_providers() -> list[str]:
    folder = resources.files("config").joinpath("providers")
    names = [tomllib.loads(entry.read_text())["provider"]
             for entry in folder.iterdir() if entry.name.endswith(".toml")]
    return sorted(names)


def test_two_providers_are_declared() -> None:
    # The grep below is only as strong as this list.
    assert declared_providers() == ["hubspot", "outreach"]


def test_no_provider_name_in_daemon_storage_or_admin_ui() -> None:
    providers = declared_providers()
    found: list[str] = []
    scanned = 0
    for tree in TREES:
        for path in sorted((REPO / tree).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            scanned += 1
            text = path.read_bytes().decode("utf-8", errors="replace").lower()
            for number, line in enumerate(text.splitlines(), 1):
                found.extend(f"{path.relative_to(REPO)}:{number}: {name}"
                             for name in providers if name in line)
    assert scanned > 50  # the trees really were read
    assert found == []
