"""The storage methods the console added, on every backend, inside the portable SQL subset."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pytest

from daemon.core.outcomes import DeadLetter
from daemon.core.states import WorkState
from storage.port import (
    AuditEntry,
    CancelParams,
    Database,
    DbStats,
    DeadQuery,
    ReplayParams,
    Row,
    SqlTx,
    WorkNotFound,
)
from storage.work_admin import CancelRefused
from storage.work_store import WorkStore
from tests.storage.test_dialect_guard import BANNED
from tests.support.backends import FreshDatabase
from tests.support.work import T0, claim, enqueue, finalize

T = TypeVar("T")


class _Recorder:
    """Records every statement on its way to the real adapter."""

    def __init__(self, inner: Database, seen: set[str]) -> None:
        self.inner = inner
        self.seen = seen
        self.backend = inner.backend
        self.stats: DbStats = inner.stats
        self.max_statement_bytes = inner.max_statement_bytes

    async def transact(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str,
                       write: bool = True) -> T:
        seen = self.seen

        class Tx:
            def __init__(self, tx: SqlTx) -> None:
                self._tx = tx

            async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
                seen.add(sql)
                return await self._tx.execute(sql, params)

            async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
                seen.add(sql)
                return await self._tx.executemany(sql, rows)

            async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
                seen.add(sql)
                return await self._tx.fetchall(sql, params)

        async def wrapped(tx: SqlTx) -> T:
            return await body(Tx(tx))

        return await self.inner.transact(wrapped, name=name, write=write)

    async def ping(self) -> None:
        await self.inner.ping()

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _dead(store: WorkStore, n: int, failure_class: str, family: str = "noop",
                now: int = T0) -> list[str]:
    ids = await enqueue(store, n, now=now, family=family)
    result = await claim(store, family=family, now=now, limit=n)
    for item in result.claimed:
        await finalize(store, item, DeadLetter(failure_class, "it broke"), now=now)
    return ids


@pytest.fixture
async def recorded(database: FreshDatabase) -> tuple[WorkStore, set[str]]:
    base = await database.open_store()
    seen: set[str] = set()
    return WorkStore(_Recorder(base.db, seen), base.dialect), seen


async def test_console_methods(recorded: tuple[WorkStore, set[str]]) -> None:
    store, seen = recorded
    boom = await _dead(store, 3, "boom")
    bad = await _dead(store, 2, "bad_payload")
    other = await _dead(store, 1, "boom", family="other")

    assert [i.work_id for i in await store.work_dead_list(DeadQuery())] == sorted(
        boom + bad + other, reverse=True)
    assert {i.work_id for i in await store.work_dead_list(
        DeadQuery(family="noop", failure_class="boom"))} == set(boom)
    page = await store.work_dead_list(DeadQuery(limit=2))
    after = await store.work_dead_list(DeadQuery(after_id=page[-1].work_id, limit=100))
    assert len(page) + len(after) == 6

    new = await store.work_replay(
        ReplayParams(work_id=boom[0], actor="a", role="admin", reason="r"), T0 + 1)
    assert [i.work_id for i in await store.work_replays_of(boom[0])] == [new.work_id]
    assert await store.work_replays_of(boom[1]) == []
    assert await store.work_replay_map(boom) == {boom[0]: new.work_id}
    assert await store.work_replay_map([]) == {}
    waiting = await store.work_dead_list(DeadQuery(family="noop", failure_class="boom",
                                                   unreplayed_only=True))
    assert {i.work_id for i in waiting} == set(boom[1:])

    classes = await store.work_dead_classes(100)
    assert [(c.family, c.failure_class, c.count) for c in classes] == [
        ("noop", "boom", 3), ("noop", "bad_payload", 2), ("other", "boom", 1)]
    assert sum(c.count for c in await store.work_dead_classes(2)) == 2  # bounded sample

    pending, held = await enqueue(store, 2, now=T0 + 2, family="c")
    (claimed,) = (await claim(store, family="c", now=T0 + 2, limit=1)).claimed
    unclaimed = held if claimed.work_id == pending else pending
    first = await store.work_cancel_audited(
        CancelParams(work_id=unclaimed, actor="o", role="operator", reason="dup"), T0 + 3)
    assert (first.disposition, first.state) == ("cancelled", WorkState.CANCELLED)
    second = await store.work_cancel_audited(
        CancelParams(work_id=claimed.work_id, actor="o", role="operator", reason="stop"),
        T0 + 3)
    assert (second.disposition, second.state) == ("requested", WorkState.PROCESSING)
    # A terminal item is refused (issue 13 item 7), with nothing written.
    with pytest.raises(CancelRefused, match="is cancelled"):
        await store.work_cancel_audited(
            CancelParams(work_id=unclaimed, actor="o", role="operator", reason="again"), T0 + 4)
    with pytest.raises(WorkNotFound):
        await store.work_cancel_audited(
            CancelParams(work_id="01ARZ3NDEKTSV4RRFFQ69G5FAV", actor="o", role="operator",
                         reason="x"), T0)
    cancels = [e for e in await store.audit_list() if e.action == "work.cancel"]
    assert sorted((e.target_id, e.reason) for e in cancels) == sorted(
        [(unclaimed, "dup"), (claimed.work_id, "stop")])
    by_target = {e.target_id: e for e in cancels}
    assert '"state": "processing"' in by_target[claimed.work_id].before

    await store.audit_append(AuditEntry(
        audit_id="01ARZ3NDEKTSV4RRFFQ69G5FAZ", at_us=T0, actor="a", role="admin",
        action="dlq.bulk_replay", target_kind="dlq", target_id="noop/boom", reason="r",
        before="{}", after="{}"))
    assert [e.action for e in await store.audit_list(target_id="noop/boom")] == [
        "dlq.bulk_replay"]

    for sql in seen:
        for construct, pattern in BANNED.items():
            assert not re.search(pattern, sql, re.IGNORECASE | re.DOTALL), (construct, sql)
