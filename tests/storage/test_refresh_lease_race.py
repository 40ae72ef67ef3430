"""A refresh lease taken for a version that another owner activated past in the same
instant (issue 9, seed 8.2): found in CI, where 8 claimants on MariaDB once refreshed
twice and the second call, with the spent refresh token, marked the grant as needing
re-authorization. The interleaving is forced here: the acquiring transaction reads the
grant at version 1, then the owner of the lease activates version 2 (freeing the lease),
then the acquirer takes the lease row. It must not win a lease for version 1.

MariaDB and Galera only: on SQLite every writing transaction holds the database's write
lock from its start (``BEGIN IMMEDIATE``), so the activation cannot commit in between.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs
import pytest

from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from storage.grants import GrantState
from storage.port import Row, SqlTx
from storage.refresh_leases import (
    AlreadyRefreshed,
    LeaseWon,
    RefreshLeaseRaced,
    refresh_lease_acquire,
)
from tests.support.backends import FreshDatabase, backend_params
from tests.support.work import T0

S = 1_000_000
KEY = TokenKey("k1", bytes(range(32)))
BUNDLE = TokenBundle(access_token=SecretText("at-SECRET"), refresh_token=SecretText("rt-SECRET"),
                     expires_at_us=0)


@pytest.fixture(params=backend_params(("mysql", "galera")))
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "galera":
        request.getfixturevalue("galera_cluster")
    return str(request.param)


@attrs.define
class _AfterGrantRead:
    """A transaction that runs ``meanwhile`` right after its first read of the grant."""

    tx: SqlTx
    meanwhile: Callable[[], Awaitable[None]]
    fired: bool = False

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self.tx.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return await self.tx.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        rows = await self.tx.fetchall(sql, params)
        if not self.fired and "FROM authorization_grants" in sql:
            self.fired = True
            await self.meanwhile()
        return rows


async def _acquire(tx: SqlTx, token: str, now: int) -> object:
    return await refresh_lease_acquire(
        tx, binding_id="b1", generation=1, seen_version=1, lease_token=token,
        work_id=f"W-{token}", epoch=1, ttl_us=30 * S, now_us=now)


async def test_a_lease_is_never_won_for_a_version_activated_past_meanwhile(
        database: FreshDatabase) -> None:
    first, second = await database.open_store(), await database.open_store()
    await first.grant_install(binding_id="b1", generation=1,
                              sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 1)),
                              expires_at_us=0, now_us=T0)

    async def take(tx: SqlTx) -> object:
        return await _acquire(tx, "A", T0)

    won = await first.db.transact(take, name="test.lease")
    assert isinstance(won, LeaseWon) and won.from_version == 1

    async def activate() -> None:
        assert await first.refresh_activate(
            binding_id="b1", generation=1, lease_token="A", from_version=1,
            sealed=seal(BUNDLE, KEY, BundleContext("b1", 1, 2)), expires_at_us=0,
            now_us=T0 + 1)

    async def late(tx: SqlTx) -> object:
        return await _acquire(_AfterGrantRead(tx, activate), "B", T0 + 2)

    outcome: object
    try:
        outcome = await second.db.transact(late, name="test.late")
    except RefreshLeaseRaced as raced:
        outcome = raced
    # Before the fix: LeaseWon(from_version=1), and a second refresh with a spent token.
    assert not isinstance(outcome, LeaseWon), outcome

    # Nothing was taken: the lease is free, and the next try is told the version moved.
    async def again(tx: SqlTx) -> object:
        return await _acquire(tx, "C", T0 + 3)

    assert await second.db.transact(again, name="test.again") == AlreadyRefreshed(2)
    grant = await second.grant_get("b1", 1)
    assert grant is not None and (grant.token_version, grant.state) == (2, GrantState.VALID)
    assert await second.refresh_count("b1", 1) == 1
