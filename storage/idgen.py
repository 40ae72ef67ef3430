"""Fresh identifiers for rows and leases (the shell side of ``daemon.core.ids``)."""

from __future__ import annotations

import os
import secrets

from daemon.core.ids import encode_ulid


def new_ulid(now_us: int) -> str:
    """A time-ordered id; ``now_us`` is the caller's clock reading."""
    return encode_ulid(now_us // 1000, os.urandom(10))


def new_lease_token() -> str:
    """128 random bits as 32 hex characters: one per claim."""
    return secrets.token_hex(16)
