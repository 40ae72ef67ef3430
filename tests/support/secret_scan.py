"""The secret scans' shared parts (seed 13; tests/e2e/test_secret_scan*.py): every GET route
of the admin app exactly as ``integrationd run`` builds it, a signed-in console client, and
the scan itself."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import httpx
from quart_trio import QuartTrio

from config.load import load_settings
from daemon.cli import admin_extensions
from daemon.services.assembly import assemble
from daemon.services.clock import WallClock
from daemon.services.families import known_family_names
from daemon.services.metrics import Metrics
from daemon.services.replica import Replica
from storage.work_store import WorkStore
from tests.ui.support import PASSWORDS


def get_routes(app: QuartTrio, values: dict[str, list[str]]) -> list[str]:
    """Every GET path of the app, each parameter filled with every known value (an
    unknown value, for a 404 body, where none is known)."""
    paths: set[str] = set()
    for rule in app.url_map.iter_rules():
        if "GET" not in (rule.methods or ()) or rule.rule.startswith("/admin/static"):
            continue
        filled = [rule.rule]
        for arg in rule.arguments:
            options = values.get(arg) or ["01J00000000000000000000000"]
            filled = [p.replace(f"<{arg}>", v) for p in filled for v in options]
        paths.update(filled)
    return sorted(paths)


async def admin_app(config: Path, store: WorkStore) -> QuartTrio:
    """The admin app exactly as ``integrationd run`` builds it from this config."""
    settings = load_settings(str(config), known_families=known_family_names())
    clock = WallClock()
    metrics = Metrics()
    parts = assemble(settings, store, clock, metrics)
    from admin_ui.app import create_app

    replica = Replica(settings, store, parts.registry, clock, metrics=metrics)
    app = create_app(replica, admin_extensions(parts))
    await parts.aclose()
    return app


async def api_app(config: Path, store: WorkStore) -> QuartTrio:
    """The service API (``/v1/``) exactly as ``integrationd run`` builds it."""
    settings = load_settings(str(config), known_families=known_family_names())
    parts = assemble(settings, store, WallClock(), Metrics())
    await parts.aclose()
    assert parts.api_app is not None, "no [[runtimes]]: no service API"
    return parts.api_app


def post_routes(app: QuartTrio) -> list[str]:
    """Every POST path of the app, each parameter filled with an unknown value."""
    paths: set[str] = set()
    for rule in app.url_map.iter_rules():
        if "POST" not in (rule.methods or ()):
            continue
        path = rule.rule
        for arg in rule.arguments:
            path = path.replace(f"<{arg}>", "01J00000000000000000000000")
        paths.add(path)
    return sorted(paths)


async def signed_in(base: str, name: str) -> httpx.AsyncClient:
    client = httpx.AsyncClient(base_url=base, timeout=20)
    form = await client.get("/admin/sign-in")
    token = form.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
    r = await client.post("/admin/sign-in", data={"name": name, "password": PASSWORDS[name],
                                                  "csrf_token": token, "next": "/admin/"})
    assert r.status_code == 302, r.text
    return client


def session_cookies(client: httpx.AsyncClient) -> dict[str, str]:
    """The signed-in client's cookies, by name (the session cookie is a credential)."""
    return {f"session cookie {name}": value for name, value in client.cookies.items()}


def leaks(secrets: dict[str, str], sources: Iterable[tuple[str, str]]) -> list[str]:
    return [f"{label} in {where}" for where, text in sources
            for label, secret in secrets.items() if secret and secret in text]


def environment_without(*names: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in names:
        env.pop(name, None)
    return env
