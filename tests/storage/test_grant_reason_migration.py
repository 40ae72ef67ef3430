"""Migration 0028 (the grant's durable reason) is upgrade-safe: grants written before it,
valid and already marked needs_reauthorization, read back with no reason (counted as
``unrecorded``), and a writer of the previous build, which never names the new columns,
keeps working beside this one; this build's writes then record and clear the reason."""

from __future__ import annotations

import base64
from pathlib import Path

from daemon.core.grant_reasons import grant_reason
from daemon.core.principals import BindingIdentity, PrincipalKind, connect
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from storage.grants import GrantState
from storage.migrate import EXPECTED_VERSION, check_schema, migrate
from storage.port import SqlTx
from storage.principals import Actor
from storage.work_store import WorkStore
from tests.support.backends import fresh_database
from tests.support.work import T0

REASON = 28
KEY = TokenKey("k1", bytes(range(32)))
BUNDLE = TokenBundle(access_token=SecretText("at-SECRET"), refresh_token=SecretText("rt-S"))


async def _old_grant(store: WorkStore, binding_id: str, state: GrantState) -> None:
    """A grant row as the build before 0028 writes it (no reason columns named)."""
    sealed = seal(BUNDLE, KEY, BundleContext(binding_id, 1, 1))

    async def body(tx: SqlTx) -> None:
        await tx.execute(
            "INSERT INTO authorization_grants (binding_id, generation, token_version,"
            " key_id, nonce_hex, ciphertext_b64, state, expires_at_us, last_refresh_at_us,"
            " updated_at_us) VALUES (?, 1, 1, ?, ?, ?, ?, 0, ?, ?)",
            (binding_id, sealed.key_id, sealed.nonce.hex(),
             base64.b64encode(sealed.ciphertext).decode(), state.value, T0, T0))

    await store.db.transact(body, name="test.old_grant")


async def _old_mark(store: WorkStore, binding_id: str) -> None:
    """The previous build's refresh_fail: the state only."""

    async def body(tx: SqlTx) -> None:
        await tx.execute("UPDATE authorization_grants SET state = ?, updated_at_us = ?"
                         " WHERE binding_id = ? AND generation = 1",
                         (GrantState.NEEDS_REAUTHORIZATION.value, T0 + 1, binding_id))

    await store.db.transact(body, name="test.old_mark")


async def test_grants_from_before_the_reason_column_read_back_without_one(
        backend: str, tmp_path: Path) -> None:
    assert EXPECTED_VERSION >= REASON
    async with fresh_database(backend, tmp_path, migrated=False) as tdb:
        store = await tdb.open_store()
        await migrate(store.db, store.dialect, T0, upto=REASON - 1)
        who = Actor("setup", "admin", "test")
        for binding_id in ("b-valid", "b-marked", "b-later"):
            await store.binding_connect(connect(
                binding_id=binding_id, kind=PrincipalKind.SHARED, org_id="o",
                app_installation_id="i", provider="p",
                identity=BindingIdentity(issuer="x", remote_account_id="a",
                                         remote_subject="s")), who, T0)
        await _old_grant(store, "b-valid", GrantState.VALID)
        await _old_grant(store, "b-marked", GrantState.NEEDS_REAUTHORIZATION)
        await _old_grant(store, "b-later", GrantState.VALID)

        assert await migrate(store.db, store.dialect, T0, upto=REASON) == [REASON]
        valid, marked = await store.grant_get("b-valid", 1), await store.grant_get("b-marked", 1)
        assert valid is not None and (valid.state, valid.reason) == (GrantState.VALID, None)
        assert marked is not None and (marked.state, marked.reason) == (
            GrantState.NEEDS_REAUTHORIZATION, None)
        # A replica of the previous build beside this one: its writes still apply.
        await _old_mark(store, "b-later")
        assert await store.grant_reauthorization_counts() == {"unrecorded": 2}

        # This build's writes: a reason with the state, cleared by a new version.
        why = grant_reason("invalid_grant")
        assert await store.grant_mark("b-valid", 1, 1, GrantState.NEEDS_REAUTHORIZATION,
                                      T0 + 2, why)
        got = await store.grant_get("b-valid", 1)
        assert got is not None and got.reason == why
        assert await store.grant_replace(
            binding_id="b-marked", generation=1, expected_version=1,
            sealed=seal(BUNDLE, KEY, BundleContext("b-marked", 1, 2)), expires_at_us=0,
            now_us=T0 + 3, refreshed=False)
        assert await store.grant_reauthorization_counts() == {"invalid_grant": 1,
                                                               "unrecorded": 1}
        await migrate(store.db, store.dialect, T0)
        await check_schema(store.db, store.dialect)
