"""`make run`'s operators: the Makefile writes a password and its hash for each example
operator, config/example.toml reads the hashes, and both can sign in to the console."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from config.load import load_settings
from daemon.services.families import known_family_names
from tests.admin.support import ConsoleHarness, console_harness, csrf_from
from tests.support.backends import FreshDatabase, fresh_database

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv"


@pytest.fixture(scope="module")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``make secrets`` once in a scratch directory, with this checkout's venv (never
    rebuilt); argon2 hashing at the default cost takes a few seconds."""
    tmp_path = tmp_path_factory.mktemp("make-run")
    if not (VENV / "bin" / "integrationd").exists():
        pytest.fail("the project venv is missing: run `make .venv/bin/.installed-run` first")
    subprocess.run(
        ["make", "--no-print-directory", "-C", str(tmp_path), "-f", str(ROOT / "Makefile"),
         f"VENV={VENV}", "-o", f"{VENV}/bin/.installed-run", "secrets"],
        check=True, capture_output=True, timeout=120,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    return tmp_path


@pytest.fixture
def made_secrets(secrets_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(secrets_dir)  # example.toml's secret paths are relative (var/secrets/)
    return secrets_dir


@pytest.fixture
async def example_console(made_secrets: Path, sqlite_db: FreshDatabase
                          ) -> AsyncIterator[ConsoleHarness]:
    settings = load_settings(str(ROOT / "config" / "example.toml"), environ={},
                             known_families=known_family_names())
    async with console_harness(sqlite_db, settings=settings) as harness:
        yield harness


@pytest.mark.parametrize(("name", "role"), [("viewer", "viewer"), ("admin", "admin")])
async def test_example_operator_signs_in_with_the_generated_password(
        example_console: ConsoleHarness, made_secrets: Path, name: str, role: str) -> None:
    secrets = made_secrets / "var" / "secrets"
    password = (secrets / f"{name}.password").read_text().strip()
    assert (secrets / f"{name}.password").stat().st_mode & 0o077 == 0  # owner only
    assert password not in (secrets / f"{name}.password-hash").read_text()
    client = example_console.client()
    form = await client.get("/admin/sign-in")
    response = await client.post("/admin/sign-in", form={
        "name": name, "password": password,
        "csrf_token": csrf_from(await form.get_data(as_text=True))})
    assert response.status_code == 302, await response.get_data(as_text=True)
    session = await (await client.get("/admin/api/session")).get_json()
    assert (session["operator"], session["role"]) == (name, role)
    overview = await client.get("/admin/")
    assert overview.status_code == 200
    operators_page = await client.get("/admin/operators")
    assert operators_page.status_code == (200 if role == "admin" else 403)


async def test_a_wrong_password_for_the_example_viewer_is_refused(
        example_console: ConsoleHarness) -> None:
    client = example_console.client()
    form = await client.get("/admin/sign-in")
    response = await client.post("/admin/sign-in", form={
        "name": "viewer", "password": "not-it",
        "csrf_token": csrf_from(await form.get_data(as_text=True))})
    assert response.status_code == 401


async def test_the_generated_session_secret_keeps_operators_signed_in_across_replicas(
        made_secrets: Path, tmp_path: Path) -> None:
    """`make secrets` writes the console's session secret and example.toml reads it: a
    session made by one replica (or before a restart) is honoured by another."""
    secret = made_secrets / "var" / "secrets" / "admin-session.secret"
    assert secret.stat().st_mode & 0o077 == 0 and len(secret.read_text().strip()) >= 48
    settings = load_settings(str(ROOT / "config" / "example.toml"), environ={},
                             known_families=known_family_names())
    password = (made_secrets / "var" / "secrets" / "viewer.password").read_text().strip()
    async with fresh_database("sqlite", tmp_path) as database, \
            console_harness(database, settings=settings) as first, \
            console_harness(database, settings=settings) as second:
        client = first.client()
        form = await client.get("/admin/sign-in")
        signed_in = await client.post("/admin/sign-in", form={
            "name": "viewer", "password": password,
            "csrf_token": csrf_from(await form.get_data(as_text=True))})
        assert signed_in.status_code == 302
        cookie = signed_in.headers["Set-Cookie"].split(";", 1)[0]
        other = second.client()
        session = await other.get("/admin/api/session", headers={"Cookie": cookie})
        assert session.status_code == 200
        assert (await session.get_json())["operator"] == "viewer"
