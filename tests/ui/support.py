"""Browser-test harness: a real replica serving the console over loopback, and Chromium.

Theory of operation
-------------------
The test function runs under trio (pytest-trio). It starts a real
:class:`~daemon.services.replica.Replica` (work loop, depth sampler,
heartbeat, and the admin app served by hypercorn on ``127.0.0.1:0``) over a
fresh SQLite database migrated with ``storage.migrate.migrate``.

Playwright's async API does not run under trio, so the browser side is a
plain synchronous function run in a worker thread
(``trio.to_thread.run_sync``) with Playwright's sync API; when it needs the
trio side (enqueue work, flip a switch, read the store) it calls back with
``trio.from_thread.run``. Debian's Chromium (``/usr/bin/chromium``) is
launched headless. Screenshots land in ``test-artifacts/ui/``.

Two test families drive the flow: ``gated`` items block until the test opens
a gate (so pressure can be seen building, then draining), and ``flaky`` items
dead-letter while the test says the provider is broken.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio
from argon2 import PasswordHasher
from playwright.sync_api import Browser, Page, sync_playwright

from admin_ui.app import console_factory
from admin_ui.extensions import ConsoleExtensions
from config.settings import (
    AdminSettings,
    FamilySettings,
    Operator,
    ReplicaSettings,
    Secret,
    Settings,
    WorkSettings,
)
from daemon.core.outcomes import DeadLetter, Outcome, Succeeded
from daemon.core.work import WorkSpec
from daemon.services.clock import WallClock
from daemon.services.families import WorkContext, build_registry
from daemon.services.replica import Replica
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import SwitchableDatabase

T = TypeVar("T")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "ui"
WAIT_MS = 30_000

PASSWORDS = {"viv": "viewer-pass-1", "otto": "operator-pass-1", "ada": "admin-pass-1"}
_FAST = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
_ROLES = {"viv": "viewer", "otto": "operator", "ada": "admin"}
_OPERATORS = tuple(Operator(name=n, role=_ROLES[n], password_hash=_FAST.hash(p))
                   for n, p in PASSWORDS.items())


@attrs.define(eq=False)
class Switchboard:
    """What the test controls about its work families."""

    gate: trio.Event = attrs.field(factory=trio.Event)
    broken: bool = True

    async def open_gate(self) -> None:
        self.gate.set()

    async def gated(self, ctx: WorkContext) -> Outcome:
        await self.gate.wait()
        return Succeeded()

    async def flaky(self, ctx: WorkContext) -> Outcome:
        if self.broken:
            return DeadLetter("provider_down", "provider answered 503 (simulated outage)")
        return Succeeded()


@attrs.define(eq=False)
class LiveConsole:
    """A running replica with its console, and the handles a test needs."""

    base_url: str
    replica: Replica
    store: WorkStore
    switch: SwitchableDatabase
    board: Switchboard

    async def enqueue(self, family: str, n: int = 1) -> list[str]:
        now = WallClock().now_us()
        specs = [WorkSpec(family=family, org_id="org-ui", subject_kind="lead",
                          subject_id=f"lead-{i}", max_attempts=1) for i in range(n)]
        ids = [r.work_id for r in await self.store.work_enqueue(specs, now)]
        self.replica.wake(family)
        return ids

    async def wait_state(self, work_id: str, state: str) -> None:
        with trio.fail_after(60):
            while True:
                item = await self.store.work_get(work_id)
                if item is not None and item.state.value == state:
                    return
                await trio.sleep(0.05)

    def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """From the browser thread: run ``fn(*args)`` on the trio side and return its result."""
        return trio.from_thread.run(fn, *args)


def settings() -> Settings:
    fast = FamilySettings(lease_ttl=30.0, batch_size=64, concurrency=64)
    return Settings(
        replica=ReplicaSettings(heartbeat_interval=0.5, drain_timeout=1.0),
        admin=AdminSettings(listen="127.0.0.1:0",
                            session_secret=Secret("ui-test-session-secret-0123456789")),
        work=WorkSettings(depth_sample_interval=0.2, poll_interval=0.05, lease_margin=2.0),
        families={"gated": fast, "flaky": fast},
        operators=_OPERATORS,
    )


@asynccontextmanager
async def live_console(database: FreshDatabase,
                       extensions: ConsoleExtensions | None = None
                       ) -> AsyncIterator[LiveConsole]:
    """Run a replica (work + console on loopback, with ``extensions``' pages) until the
    block ends, then drain it."""
    inner = await database.open_store()
    switch = SwitchableDatabase(inner.db)
    store = WorkStore(switch, inner.dialect)
    board = Switchboard()
    cfg = settings()
    registry = build_registry(cfg, {"gated": board.gated, "flaky": board.flaky})
    replica = Replica(cfg, store, registry, WallClock(), replica_id="ui-replica",
                      admin_app=console_factory(extensions))
    async with trio.open_nursery() as nursery:
        address = await nursery.start(replica.run)
        try:
            base = address if address.startswith("http") else f"http://{address}"
            yield LiveConsole(base, replica, store, switch, board)
        finally:
            switch.down = False
            board.gate.set()
            replica.request_drain()


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


async def in_browser(live: LiveConsole, scenario: Callable[[Page, LiveConsole], None]) -> None:
    """Run ``scenario(page, live)`` in a worker thread with a fresh browser page."""

    def run() -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with chromium() as browser:
            context = browser.new_context(base_url=live.base_url,
                                          viewport={"width": 1440, "height": 900})
            try:
                page = context.new_page()
                page.set_default_timeout(WAIT_MS)
                scenario(page, live)
            finally:
                context.close()

    await trio.to_thread.run_sync(run)


def sign_in(page: Page, name: str, password: str | None = None) -> None:
    page.goto("/admin/sign-in")
    page.fill("#name", name)
    page.fill("#password", password or PASSWORDS[name])
    page.click("#sign-in")


def shot(page: Page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
