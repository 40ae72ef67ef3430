"""Token bundles: sealed, bound to where they belong, and silent in every repr."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.token_bundle import (
    BundleContext,
    BundleRefused,
    SealedBundle,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    rewrap,
    seal,
)

K1 = TokenKey("k1", bytes(range(32)))
K2 = TokenKey("k2", bytes(range(1, 33)))
KEYS = {"k1": K1, "k2": K2}
CTX = BundleContext("hubspot-main", 3, 7)
BUNDLE = TokenBundle(access_token=SecretText("at-SECRET-1"),
                     refresh_token=SecretText("rt-SECRET-1"), expires_at_us=1_900_000_000_000_000,
                     scopes=("crm.objects.contacts.write",))


def test_round_trip() -> None:
    sealed = seal(BUNDLE, K1, CTX)
    assert sealed.key_id == "k1"
    assert open_bundle(sealed, KEYS, CTX) == BUNDLE
    assert b"SECRET" not in sealed.ciphertext
    # A fresh nonce every time: sealing twice never gives the same bytes.
    assert seal(BUNDLE, K1, CTX).ciphertext != sealed.ciphertext


def test_without_a_refresh_token() -> None:
    plain = attrs.evolve(BUNDLE, refresh_token=None, scopes=())
    assert open_bundle(seal(plain, K2, CTX), KEYS, CTX) == plain


REFUSALS = [
    # (what changed, reason)
    ("binding", BundleContext("other", 3, 7), None, "token_bundle_unauthentic"),
    ("generation", BundleContext("hubspot-main", 4, 7), None, "token_bundle_unauthentic"),
    ("older version", BundleContext("hubspot-main", 3, 6), None, "token_bundle_unauthentic"),
    ("flipped bit", CTX, "flip", "token_bundle_unauthentic"),
    ("truncated", CTX, "truncate", "token_bundle_unauthentic"),
    ("other key under the same id", CTX, "swap_key", "token_bundle_unauthentic"),
    ("unknown key id", CTX, "unknown_key", "token_key_missing"),
]


@pytest.mark.parametrize(("what", "context", "tamper", "reason"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])
def test_a_bundle_out_of_place_or_tampered_is_refused(
        what: str, context: BundleContext, tamper: str | None, reason: str) -> None:
    sealed = seal(BUNDLE, K1, CTX)
    keys = dict(KEYS)
    if tamper == "flip":
        sealed = SealedBundle(sealed.key_id, sealed.nonce,
                              bytes([sealed.ciphertext[0] ^ 1]) + sealed.ciphertext[1:])
    elif tamper == "truncate":
        sealed = SealedBundle(sealed.key_id, sealed.nonce, sealed.ciphertext[:-1])
    elif tamper == "swap_key":
        keys["k1"] = TokenKey("k1", bytes(32))
    elif tamper == "unknown_key":
        sealed = attrs.evolve(sealed, key_id="k9")
    with pytest.raises(BundleRefused) as info:
        open_bundle(sealed, keys, context)
    assert info.value.reason == reason
    assert "SECRET" not in str(info.value)


def test_rewrap_changes_only_the_wrapping() -> None:
    sealed = seal(BUNDLE, K1, CTX)
    nxt = BundleContext("hubspot-main", 3, 8)
    moved = rewrap(sealed, KEYS, CTX, K2, nxt)
    assert moved.key_id == "k2"
    assert open_bundle(moved, KEYS, nxt) == BUNDLE
    with pytest.raises(BundleRefused):
        open_bundle(moved, KEYS, CTX)  # the old version no longer authenticates it


def test_nothing_secret_in_any_repr() -> None:
    sealed = seal(BUNDLE, K1, CTX)
    text = " ".join(repr(x) + str(x) for x in (BUNDLE, sealed, K1, BUNDLE.access_token))
    for secret in ("at-SECRET-1", "rt-SECRET-1", K1.material.hex(), sealed.ciphertext.hex()):
        assert secret not in text


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_a_key_of_the_wrong_size_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="expected 32 bytes"):
        TokenKey("bad", bytes(size))
