"""Print a new RSA private key (unencrypted PKCS#8 PEM) for the sandbox's S2S app.

``make run`` keeps it in ``var/secrets/outreach-app.pem``: the Outreach binding signs its
app JWTs with it, and ``python -m sandbox`` derives the public key the mounted token
endpoint checks them with from the same file. Never a key for a real app.
"""

from __future__ import annotations

import sys

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


def private_pem() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


if __name__ == "__main__":
    sys.stdout.buffer.write(private_pem())
