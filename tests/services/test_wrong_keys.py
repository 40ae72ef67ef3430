"""The start-up check for token keys (``daemon.services.key_rotation.wrong_keys``) against
real stored grants (SQLite, MariaDB): a different key under the right id is found; one
tampered bundle under a right key is not a reason to stop."""

from __future__ import annotations

from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.services.key_rotation import WRONG_KEY_SAMPLE, wrong_keys
from storage.work_store import WorkStore
from tests.support.work import T0

RIGHT = TokenKey("k1", bytes(range(32)))
WRONG = TokenKey("k1", bytes(range(1, 33)))
OTHER = TokenKey("k2", bytes(range(100, 132)))


async def _install(store: WorkStore, binding_id: str, key: TokenKey) -> None:
    bundle = TokenBundle(access_token=SecretText(f"access-SECRET-{binding_id}"),
                         expires_at_us=T0)
    await store.grant_install(binding_id=binding_id, generation=1,
                              sealed=seal(bundle, key, BundleContext(binding_id, 1, 1)),
                              expires_at_us=T0, now_us=T0)


async def test_a_different_key_under_the_right_id_is_named(store: WorkStore) -> None:
    for i in range(3):
        await _install(store, f"b{i}", RIGHT)
    await _install(store, "c0", OTHER)
    assert await wrong_keys(store, {"k1": RIGHT, "k2": OTHER}) == []
    assert await wrong_keys(store, {"k1": WRONG, "k2": OTHER}) == [
        ("k1", "token key 'k1' opens none of the 3 stored bundle(s) sealed under its id"
               " that were tried (a different key under that id?)")]
    # A key id that is not loaded is keys status's to report, not this check's.
    assert await wrong_keys(store, {"k1": RIGHT}) == []


async def test_one_tampered_bundle_under_a_right_key_does_not_stop_the_replica(
        store: WorkStore) -> None:
    # Sealed under another key but labelled k1 (a row moved from another deployment):
    # it fails authentication under the right k1, which still opens the others.
    await _install(store, "a-tampered", WRONG)
    await _install(store, "b-good", RIGHT)
    assert await wrong_keys(store, {"k1": RIGHT}) == []


async def test_the_check_tries_a_bounded_sample(store: WorkStore) -> None:
    for i in range(WRONG_KEY_SAMPLE + 3):
        await _install(store, f"b{i:02d}", RIGHT)
    ((key_id, message),) = await wrong_keys(store, {"k1": WRONG})
    assert key_id == "k1" and f"none of the {WRONG_KEY_SAMPLE} stored" in message
