"""A successor judges a refresh in doubt from the lease row as it read it; the owner, certain
it never sent, ends that lease unspent (``refresh_unsent``) between the successor's read and
its write. The doubt must not be written after the owner's end: nobody would undo it, and
the binding's work would wait for an operator though the refresh token was never presented.

The successor's in-doubt write holds the lease row as read in the same transaction (an
UPDATE naming it as read), so it sees the owner's end and reads again. MariaDB and Galera
only: on SQLite writers are serial, so the owner cannot commit inside the successor's
transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest
import trio

from storage.grants import GrantState
from storage.port import Row, SqlTx
from storage.refresh_leases import LeaseWon, RefreshLeaseRaced, refresh_lease_acquire
from storage.work_store import WorkStore
from tests.storage.test_refresh_dispatch import TTL, _acquire, _grant, _state
from tests.storage.test_refresh_unsent import _dispatch, _unsent
from tests.support.backends import FreshDatabase, backend_params
from tests.support.work import T0


@pytest.fixture(params=backend_params(("mysql", "galera")))
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "galera":
        request.getfixturevalue("galera_cluster")
    return str(request.param)


class _OwnerEndsAfterTheLeaseRead:
    """The successor's transaction; right after it read the lease row, the owner ends
    the lease unspent on another connection and commits."""

    def __init__(self, tx: SqlTx, store: WorkStore, now: int) -> None:
        self._tx, self._store, self._now = tx, store, now
        self.owner_healed: bool | None = None

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        rows = await self._tx.fetchall(sql, params)
        if sql.startswith("SELECT lease_token, until_us") and self.owner_healed is None:
            self.owner_healed = await _unsent(self._store, "A", self._now)
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


async def test_a_doubt_judged_from_a_lease_its_owner_ended_meanwhile_is_not_written(
        database: FreshDatabase) -> None:
    store = await database.open_store()
    fence = await _grant(store)
    assert isinstance(await _acquire(store, "A", T0), LeaseWon)
    assert await _dispatch(store, "A", T0 + 1, fence) is None
    # Owner A froze past its lease after its marker, and never sent. Successor B reads
    # the expired, marked lease; A wakes and ends it unspent before B writes.
    later = T0 + TTL + 1
    probe: _OwnerEndsAfterTheLeaseRead | None = None

    async def successor(tx: SqlTx) -> object:
        nonlocal probe
        probe = _OwnerEndsAfterTheLeaseRead(tx, store, later)
        return await refresh_lease_acquire(
            cast(SqlTx, probe), binding_id="b1", generation=1, seen_version=1,
            lease_token="B", work_id="W-B", epoch=1, ttl_us=TTL, now_us=later)

    with trio.fail_after(30):
        try:
            outcome: object = await store.db.transact(successor, name="test.successor")
        except RefreshLeaseRaced:
            outcome = "raced"
    assert probe is not None and probe.owner_healed is False  # nothing was in doubt yet
    # B saw the lease move and wrote nothing; read again, it takes the lease and
    # refreshes normally, from the same version: the token was never presented.
    assert outcome == "raced", (
        f"the owner ended its lease unspent, yet the successor answered {outcome!r}"
        f" and the grant is {await _state(store)}")
    assert await _state(store) == (GrantState.VALID, 1, None)
    won = await _acquire(store, "C", later + 1)
    assert isinstance(won, LeaseWon) and won.from_version == 1
