"""Operator passwords: argon2id hashes, verified off the event loop.

A failed sign-in costs the same whether the name is unknown, has no password
(proxy-only operators) or the password is wrong: each path runs one argon2
verification (against a dummy hash when there is no real one) and the caller
answers the same generic message. Verifications run in worker threads, at
most two at a time, so a burst of sign-ins cannot stall the replica's event
loop or take more than two argon2 memory blocks.
"""

from __future__ import annotations

import secrets

import trio
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from config.settings import Operator

MAX_PASSWORD_CHARS = 1024


def hash_password(password: str) -> str:
    """An argon2id PHC string with argon2-cffi's default (RFC 9106 low-memory) parameters."""
    if not password:
        raise ValueError("the password is empty")
    return PasswordHasher().hash(password)


class PasswordVerifier:
    """Check an operator's password; uniform cost for every failure."""

    def __init__(self, concurrency: int = 2) -> None:
        self._hasher = PasswordHasher()
        self._dummy: str | None = None
        self._concurrency = concurrency
        self._limiter: trio.CapacityLimiter | None = None

    def _check(self, phc: str | None, password: str) -> bool:
        if self._dummy is None:
            self._dummy = self._hasher.hash(secrets.token_urlsafe(16))
        try:
            ok = self._hasher.verify(phc or self._dummy, password)
        except (VerificationError, InvalidHashError):
            return False
        return bool(ok) and phc is not None

    async def verify(self, operator: Operator | None, password: str) -> bool:
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(self._concurrency)
        phc = operator.password_hash if operator is not None and operator.password_hash else None
        candidate = password[:MAX_PASSWORD_CHARS]
        ok = await trio.to_thread.run_sync(self._check, phc, candidate, limiter=self._limiter)
        return ok and len(password) <= MAX_PASSWORD_CHARS
