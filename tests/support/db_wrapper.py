"""A real database behind a thin wrapper, for tests that watch or stall some of its
transactions: everything is the inner database's, and a subclass overrides
``transact``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs

from storage.port import Database, DbStats, SqlTx

T = TypeVar("T")


@attrs.define(eq=False)
class DatabaseWrapper:
    inner: Database

    @property
    def backend(self) -> str:
        return self.inner.backend

    @property
    def stats(self) -> DbStats:
        return self.inner.stats

    @property
    def max_statement_bytes(self) -> int:
        return self.inner.max_statement_bytes

    async def transact(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str,
                       write: bool = True) -> T:
        return await self.inner.transact(body, name=name, write=write)

    async def ping(self) -> None:
        await self.inner.ping()

    async def aclose(self) -> None:
        await self.inner.aclose()
