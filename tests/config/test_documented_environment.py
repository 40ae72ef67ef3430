"""Every INTEGRATIOND_* name that README.md, docs/, systemd/ or the example config tells an
operator to set is one that integrationd (or its test suite) actually reads.

Each documented name is probed: set it, and the value must arrive where the documentation
says. A name nothing reads fails, so a typo (or a search-and-replace accident) in the docs
cannot survive."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from config.load import ConfigError, parse_settings
from config.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "systemd").iterdir()), ROOT / "config" / "example.toml"]
NAME = re.compile(r"\bINTEGRATIOND_[A-Z0-9_]*[A-Z0-9]")
FAMILIES = ("noop", "external_effect", "runtime_receipt")
# The documented spelling of the generic override form, not a name to set.
PLACEHOLDER = "INTEGRATIOND__SECTION__KEY"


def documented_names() -> list[str]:
    found: set[str] = set()
    for path in DOCUMENTS:
        found.update(NAME.findall(path.read_text()))
    return sorted(found)


def _runtime(name: str) -> dict[str, Any]:
    return {"name": name, "org_id": "o", "app_installation_id": "i",
            "runtime_capability_id": "c", "runtime_work_binding_digest": "d"}


def _binding(binding_id: str) -> dict[str, Any]:
    return {"binding_id": binding_id, "provider": "p", "org_id": "o",
            "app_installation_id": "i", "remote_account_id": "r",
            "base_url": "http://127.0.0.1:1", "auth": "static_token"}


def _settings(env: dict[str, str], raw: dict[str, Any] | None = None) -> Settings:
    return parse_settings(raw or {}, environ=env, known_families=FAMILIES)


_SAMPLES = {"url": "mysql://someone@db.example:3306/elsewhere", "listen": "127.0.0.1:9999",
            "auth": "proxy", "sqlite_synchronous": "EXTRA"}


def _probe_override(name: str) -> None:
    """``INTEGRATIOND__SECTION__KEY``: the value lands in that setting."""
    path = [p.lower() for p in name[len("INTEGRATIOND__"):].split("__")]
    baseline = _settings({})
    value = _SAMPLES.get(path[-1], "7")
    changed = _settings({name: value})
    if path[0] == "families":
        before, after = baseline.family(path[1]), changed.family(path[1])
    else:
        before, after = getattr(baseline, path[0]), getattr(changed, path[0])
    assert getattr(after, path[-1]) != getattr(before, path[-1]), name


def _probe_secret(name: str) -> None:
    body = name[len("INTEGRATIOND_"):]
    env = {name: "s3cret"}
    if body == "STORAGE_PASSWORD":
        assert _settings(env).storage.password is not None
    elif body == "ADMIN_SESSION_SECRET":
        assert _settings(env).admin.session_secret is not None
    elif (m := re.fullmatch(r"RUNTIME_([A-Z0-9_]+?)(_RESULTS)?_TOKEN", body)):
        (runtime,) = _settings(env, {"runtimes": [_runtime(m.group(1).lower())]}).runtimes
        assert (runtime.results_token if m.group(2) else runtime.token) is not None
    elif (m := re.fullmatch(r"BINDING_([A-Z0-9_]+)_TOKEN", body)):
        binding_id = m.group(1).lower().replace("_", "-")
        (binding,) = _settings(env, {"bindings": [_binding(binding_id)]}).bindings
        assert binding.token is not None
    elif (m := re.fullmatch(r"BINDING_([A-Z0-9_]+)_S2S_KEY", body)):
        from sandbox.demo_keys import private_pem  # the key is checked: a real RSA key

        binding_id = m.group(1).lower().replace("_", "-")
        (binding,) = _settings({name: private_pem().decode()}, {"bindings": [{
            **_binding(binding_id), "auth": "s2s", "s2s_app_id": "a",
            "s2s_installation_id": "i", "token_url": "http://127.0.0.1:1/mint"}]}).bindings
        assert binding.s2s_private_key is not None
    elif (m := re.fullmatch(r"WEBHOOK_([A-Z0-9_]+?)(_PREVIOUS)?_SECRET", body)):
        route_name = m.group(1).lower().replace("_", "-")
        (route,) = _settings(env, {
            # A binding with no static token (auth left to its default: a grant).
            "bindings": [{**{k: v for k, v in _binding("b").items() if k != "auth"},
                          "provider": "hubspot"}],
            "webhook_routes": [{"route": route_name, "binding_id": "b",
                                "webhook": "hubspot.contact_events"}]}).webhook_routes
        assert (route.previous_secret if m.group(2) else route.secret) is not None
    else:
        raise AssertionError(f"{name} is documented, but nothing reads it")


def _probe_in_process(name: str, expression: str) -> None:
    """Set ``name`` in a fresh interpreter and read it back where the code reads it."""
    env = {**os.environ, name: "mysql://probe@127.0.0.1:1/probe"}
    out = subprocess.run([sys.executable, "-c", expression], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == env[name]


def probe(name: str) -> None:
    if name == PLACEHOLDER:
        return
    if name.startswith("INTEGRATIOND__"):
        _probe_override(name)
    elif name == "INTEGRATIOND_CONFIG":
        _probe_in_process(name, "from daemon.cli import _parser;"
                                " print(_parser().parse_args(['check-config']).config)")
    elif name == "INTEGRATIOND_TEST_MYSQL_URL":
        _probe_in_process(name, "from tests.support.backends import MYSQL_URL; print(MYSQL_URL)")
    elif name == "INTEGRATIOND_BENCH_PG_DSN":
        _probe_in_process(name, "from bench.kernel import PG_DSN; print(PG_DSN)")
    else:
        _probe_secret(name)


def test_the_documents_name_environment_variables() -> None:
    names = documented_names()
    assert "INTEGRATIOND_STORAGE_PASSWORD" in names and "INTEGRATIOND__STORAGE__URL" in names


@pytest.mark.parametrize("name", documented_names())
def test_documented_environment_name_is_read(name: str) -> None:
    probe(name)


@pytest.mark.parametrize("name", [
    "INTEGRATIOND_STORAGE_PASWORD",
    "INTEGRATIOND_ADMIN_SECRET",
    "INTEGRATIOND__STORAGE__NOPE",
    "INTEGRATIOND__FAMILIES__NOPE__BATCH_SIZE",
])
def test_a_name_nothing_reads_fails_the_probe(name: str) -> None:
    with pytest.raises((AssertionError, ConfigError)):
        probe(name)
