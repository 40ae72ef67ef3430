"""Fixtures for HTTP-level console tests: the real app over a real database, no browser.

The app is the one ``create_app`` builds for a real (not running) ``Replica``
on a fresh migrated database; requests go through Quart's ASGI test client.
Operators: ``viv`` (viewer), ``otto`` (operator), ``ada`` (admin), ``prox``
(operator without a password: proxy mode only).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.admin.support import ConsoleHarness, console_harness
from tests.support.backends import FreshDatabase, fresh_database


@pytest.fixture
async def sqlite_db(tmp_path: Path) -> AsyncIterator[FreshDatabase]:
    async with fresh_database("sqlite", tmp_path) as tdb:
        yield tdb


@pytest.fixture
async def console(sqlite_db: FreshDatabase) -> AsyncIterator[ConsoleHarness]:
    async with console_harness(sqlite_db) as harness:
        yield harness
