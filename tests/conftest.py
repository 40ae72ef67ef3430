"""Shared fixtures: a fresh real database per test, on every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbox.galera import GaleraCluster, GaleraUnavailable
from storage.work_store import WorkStore
from tests.support.backends import (
    DROPPER,
    FreshDatabase,
    backend_params,
    fresh_database,
    use_galera,
)


@pytest.fixture(params=backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session", autouse=True)
def _every_database_dropped() -> Iterator[None]:
    """The session ends once the MariaDB databases its tests handed over are dropped
    (tests/support/backends.py drops them on a thread while the next tests run)."""
    yield
    DROPPER.wait()


@pytest.fixture(scope="session")
def galera_cluster() -> Iterator[GaleraCluster]:
    """One 3-node Galera cluster for the whole session (up in ~20 s), started on first use;
    each test makes its own database on it. Under pytest-xdist each worker is a session of
    its own, with its own cluster on its own ports."""
    cluster = GaleraCluster.create(die_with_parent=True)
    try:
        try:
            cluster.start()
        except GaleraUnavailable as first:
            # Once more, on fresh ports: in a CI rehearsal (2026-12-08) a node exited during
            # start and failed one worker's whole Galera suite (370 errors); why is not
            # known (its log went with the cluster's directory; it now comes with the
            # error). The first attempt's reason is kept.
            cluster.stop()
            cluster = GaleraCluster.create(die_with_parent=True)
            try:
                cluster.start()
            except GaleraUnavailable as second:
                raise second from first
        use_galera(cluster)
        yield cluster
    finally:
        use_galera(None)
        cluster.stop()


@pytest.fixture
async def database(backend: str, tmp_path: Path) -> AsyncIterator[FreshDatabase]:
    async with fresh_database(backend, tmp_path) as tdb:
        yield tdb


@pytest.fixture
async def store(database: FreshDatabase) -> WorkStore:
    return await database.open_store()
