"""The storage conformance suite runs on every backend, Galera included (issue 12): a
3-node cluster per session, a fresh database per test, the stores of one test on
different nodes (see tests/support/backends.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import storage.commands
from storage.port import SqlTx
from tests.support.backends import STORAGE_BACKENDS, backend_params


@pytest.fixture(params=backend_params(STORAGE_BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "galera":
        request.getfixturevalue("galera_cluster")
    return str(request.param)


@pytest.fixture
def admission_before_history_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A migration test stands this build's admission in for the build of an earlier
    schema step. That build did not count admissions into the console's history
    (``history_flow``, migration 0043), which its schema does not have: here the admission
    leaves that count out, and writes everything else as this build does."""

    async def not_counted(tx: SqlTx, commands: Sequence[tuple[str, str, str, str]],
                          now_us: int) -> None:
        return None

    monkeypatch.setattr(storage.commands, "count_accepted", not_counted)
