"""Shared fixtures: a fresh real database per test, on every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from storage.work_store import WorkStore
from tests.support.backends import BACKENDS, FreshDatabase, fresh_database


def _backend_params() -> list[object]:
    return [
        pytest.param(b, marks=[pytest.mark.mysql] if b == "mysql" else [], id=b)
        for b in BACKENDS
    ]


@pytest.fixture(params=_backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def database(backend: str, tmp_path: Path) -> AsyncIterator[FreshDatabase]:
    async with fresh_database(backend, tmp_path) as tdb:
        yield tdb


@pytest.fixture
async def store(database: FreshDatabase) -> WorkStore:
    return await database.open_store()
