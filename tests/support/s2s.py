"""RSA keys for S2S app JWTs in tests (made once per process: 2048-bit keys are slow)."""

from __future__ import annotations

import functools

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa


@functools.cache
def private_pem(name: str = "app") -> bytes:
    """An unencrypted PKCS#8 RSA private key; the same one for the same ``name``."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_pem(private: bytes) -> bytes:
    key = serialization.load_pem_private_key(private, password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def ec_private_pem() -> bytes:
    """A private key that is not RSA (an RS256 JWT cannot be signed with it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
