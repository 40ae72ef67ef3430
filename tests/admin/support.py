"""Console test harness: settings with operators, the app, signed-in clients."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
from argon2 import PasswordHasher
from quart.typing import TestClientProtocol
from quart_trio import QuartTrio

from admin_ui.app import create_app
from config.settings import (
    AdminSettings,
    Operator,
    ReplicaSettings,
    Secret,
    Settings,
    WorkSettings,
)
from daemon.core.outcomes import DeadLetter
from daemon.services.clock import WallClock
from daemon.services.families import build_registry, noop_handler
from daemon.services.replica import Replica
from storage.port import ClaimParams
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.work import finalization, spec

PASSWORDS = {"viv": "viewer-pass-1", "otto": "operator-pass-1", "ada": "admin-pass-1"}
SESSION_SECRET = "test-session-secret-0123456789abcdef"
# Cheap argon2id parameters for tests; verification reads them from the hash.
_FAST = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
_HASHES = {name: _FAST.hash(pw) for name, pw in PASSWORDS.items()}


def operators() -> tuple[Operator, ...]:
    return (
        Operator(name="viv", role="viewer", password_hash=_HASHES["viv"]),
        Operator(name="otto", role="operator", password_hash=_HASHES["otto"]),
        Operator(name="ada", role="admin", password_hash=_HASHES["ada"]),
        Operator(name="prox", role="operator"),
    )


def console_settings(**admin: Any) -> Settings:
    return Settings(
        replica=ReplicaSettings(heartbeat_interval=1.0),
        admin=AdminSettings(listen="127.0.0.1:0",
                            session_secret=Secret(SESSION_SECRET), **admin),
        work=WorkSettings(depth_sample_interval=0.2),
        operators=operators(),
    )


CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]*)">')


def csrf_from(html: str) -> str:
    found = CSRF_META.search(html)
    assert found is not None, "page has no csrf meta tag"
    return found.group(1)


@attrs.define(eq=False)
class ConsoleHarness:
    database: FreshDatabase
    store: WorkStore
    replica: Replica
    app: QuartTrio

    def client(self) -> TestClientProtocol:
        return self.app.test_client()

    async def sign_in(self, name: str, password: str | None = None) -> tuple[
            TestClientProtocol, str]:
        """A client signed in as ``name``, and its CSRF token."""
        client = self.client()
        form_page = await client.get("/admin/sign-in")
        csrf = csrf_from(await form_page.get_data(as_text=True))
        response = await client.post("/admin/sign-in", form={
            "name": name, "password": password or PASSWORDS[name], "csrf_token": csrf,
            "next": "/admin/",
        })
        assert response.status_code == 302, await response.get_data(as_text=True)
        session = await client.get("/admin/api/session")
        doc = await session.get_json()
        return client, str(doc["csrf_token"])

    async def dead_items(self, n: int, family: str = "noop",
                         failure_class: str = "boom", **kw: Any) -> list[str]:
        """``n`` items of ``family`` moved to dead (claimed and dead-lettered, fenced)."""
        now = WallClock().now_us()
        results = await self.store.work_enqueue(
            [spec(family=family, **kw) for _ in range(n)], now)
        ids = [r.work_id for r in results]
        claimed = await self.store.work_claim(
            ClaimParams(family=family, owner="test", limit=n, lease_ttl_us=30_000_000,
                        window=n * 4), now)
        assert len(claimed.claimed) == n
        fins = [finalization(i, DeadLetter(failure_class, f"{failure_class} happened"), now)
                for i in claimed.claimed]
        await self.store.work_finalize_if_owner(fins, "test", lambda: now)
        return ids

    async def enqueue(self, n: int = 1, **kw: Any) -> list[str]:
        now = WallClock().now_us()
        results = await self.store.work_enqueue([spec(**kw) for _ in range(n)], now)
        return [r.work_id for r in results]


@asynccontextmanager
async def console_harness(database: FreshDatabase, store: WorkStore | None = None,
                          settings: Settings | None = None,
                          families: Sequence[str] = ("noop",)) -> AsyncIterator[
                              ConsoleHarness]:
    store = store or await database.open_store()
    cfg = settings or console_settings()
    registry = build_registry(cfg, {name: noop_handler for name in families})
    replica = Replica(cfg, store, registry, WallClock(), replica_id="console-test")
    yield ConsoleHarness(database, store, replica, create_app(replica))
