"""Browser tests: a fresh migrated SQLite database and a live replica per test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.backends import fresh_database
from tests.ui.support import LiveConsole, live_console


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[LiveConsole]:
    async with fresh_database("sqlite", tmp_path) as database, live_console(database) as console:
        yield console
