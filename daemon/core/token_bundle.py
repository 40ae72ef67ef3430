"""Token bundles: a grant's secret material, sealed with an AEAD cipher (seed 8.2).

Theory of operation
-------------------
An :class:`AuthorizationGrant`'s access token, refresh token, expiry and scopes exist at rest
only as one sealed bundle: AES-256-GCM (``cryptography``) under a key named by its key id,
with a fresh 96-bit nonce per seal. The associated data binds the bundle to where it
belongs: binding id, binding generation and token version. A bundle copied onto another
binding, replayed into another generation or rolled back to another version fails
authentication and is never used (:class:`BundleRefused`, a stable reason, no secret).

The plaintext is canonical JSON; the token strings travel as :class:`SecretText`, whose
``repr`` hides them, so a bundle can be logged or put in an error by mistake and still
show nothing. Pure: no I/O, keys are handed in.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from daemon.core.canonical import canonical_bytes

BUNDLE_FORMAT = 1
_NONCE_BYTES = 12
KEY_BYTES = 32


@attrs.frozen
class SecretText:
    """A secret string; ``repr`` and ``str`` never show it."""

    value: str = attrs.field(repr=False)

    def __repr__(self) -> str:
        return "SecretText(***)"

    __str__ = __repr__

    def reveal(self) -> str:
        return self.value


@attrs.frozen(kw_only=True)
class TokenBundle:
    access_token: SecretText
    refresh_token: SecretText | None = None
    expires_at_us: int = 0
    scopes: tuple[str, ...] = ()


@attrs.frozen
class BundleContext:
    """Where a bundle belongs: authenticated with it, never encrypted."""

    binding_id: str
    generation: int
    token_version: int

    def associated_data(self) -> bytes:
        return canonical_bytes({"binding_id": self.binding_id, "format": BUNDLE_FORMAT,
                                "generation": self.generation,
                                "token_version": self.token_version})


@attrs.frozen
class SealedBundle:
    key_id: str
    nonce: bytes = attrs.field(repr=False)
    ciphertext: bytes = attrs.field(repr=False)


@attrs.frozen
class TokenKey:
    """One encryption key; ``repr`` shows only its id."""

    key_id: str
    material: bytes = attrs.field(repr=False)

    def __attrs_post_init__(self) -> None:
        if len(self.material) != KEY_BYTES:
            raise ValueError(f"token key {self.key_id}: expected {KEY_BYTES} bytes,"
                             f" got {len(self.material)}")


class BundleRefused(Exception):
    """A sealed bundle that must not be used; ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def seal(bundle: TokenBundle, key: TokenKey, context: BundleContext, *,
         nonce: bytes | None = None) -> SealedBundle:
    """Encrypt ``bundle`` for ``context`` under ``key`` (a fresh nonce unless one is given,
    which only golden-vector tests do)."""
    plain = canonical_bytes({
        "access_token": bundle.access_token.reveal(),
        "expires_at_us": bundle.expires_at_us,
        "refresh_token": None if bundle.refresh_token is None else bundle.refresh_token.reveal(),
        "scopes": list(bundle.scopes),
    })
    nonce = os.urandom(_NONCE_BYTES) if nonce is None else nonce
    if len(nonce) != _NONCE_BYTES:
        raise ValueError("a nonce is 12 bytes")
    return SealedBundle(key.key_id, nonce,
                        AESGCM(key.material).encrypt(nonce, plain, context.associated_data()))


def open_bundle(sealed: SealedBundle, keys: Mapping[str, TokenKey],
                context: BundleContext) -> TokenBundle:
    """Decrypt and authenticate, or raise :class:`BundleRefused`."""
    key = keys.get(sealed.key_id)
    if key is None:
        raise BundleRefused("token_key_missing",
                            f"no token key {sealed.key_id!r} is loaded")
    try:
        plain = AESGCM(key.material).decrypt(sealed.nonce, sealed.ciphertext,
                                             context.associated_data())
    except (InvalidTag, ValueError):
        raise BundleRefused(
            "token_bundle_unauthentic",
            f"the token bundle of binding {context.binding_id} generation"
            f" {context.generation} version {context.token_version} failed authentication"
        ) from None
    doc = json.loads(plain)
    refresh = doc.get("refresh_token")
    return TokenBundle(access_token=SecretText(str(doc["access_token"])),
                       refresh_token=None if refresh is None else SecretText(str(refresh)),
                       expires_at_us=int(doc["expires_at_us"]),
                       scopes=tuple(str(s) for s in doc["scopes"]))


def rewrap(sealed: SealedBundle, keys: Mapping[str, TokenKey], old: BundleContext,
           new_key: TokenKey, new: BundleContext) -> SealedBundle:
    """The same secret material under ``new_key`` and ``new`` (the next token version):
    authority unchanged, only the wrapping."""
    return seal(open_bundle(sealed, keys, old), new_key, new)
