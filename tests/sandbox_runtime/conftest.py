"""The reference Runtime's fixtures: a fake integrationd and a Runtime served against it, both
real HTTP servers on loopback (a module may define its own ``rt``, as test_dispatcher.py does)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.sandbox_runtime import FakeIntegration, RunningRuntime, running_fake, running_runtime


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeIntegration, str]]:
    async with running_fake() as pair:
        yield pair


@pytest.fixture
async def rt(fake: tuple[FakeIntegration, str]) -> AsyncIterator[RunningRuntime]:
    async with running_runtime(fake[1]) as running:
        yield running
