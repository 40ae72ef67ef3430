"""The storage conformance suite runs on every backend, Galera included (issue 12): a
3-node cluster per session, a fresh database per test, the stores of one test on
different nodes (see tests/support/backends.py)."""

from __future__ import annotations

import pytest

from tests.support.backends import STORAGE_BACKENDS, backend_params


@pytest.fixture(params=backend_params(STORAGE_BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "galera":
        request.getfixturevalue("galera_cluster")
    return str(request.param)
