"""Helpers for retention tests: a pruner on a fixed clock, and row counts."""

from __future__ import annotations

from typing import Any

import attrs

from config.settings import RetentionSettings
from daemon.core.retention import DAY_US
from daemon.services.metrics import Metrics
from daemon.services.retention import Pruner
from storage.work_store import WorkStore
from tests.support.work import T0

WORK_DAYS = 30
FACTS_DAYS = 400
INGRESS_DAYS = 14  # ingress.retention_days
PAST_WORK = T0 + (WORK_DAYS + 1) * DAY_US  # past the work horizon of T0, not the facts one
PAST_FACTS = T0 + (FACTS_DAYS + 1) * DAY_US


@attrs.define
class FixedClock:
    now: int

    def now_us(self) -> int:
        return self.now


def pruner(store: WorkStore, now_us: int, *, holder: str = "pruner-a", batch_rows: int = 7,
           batch_bytes: int = 8_000_000, lease_ttl: float = 60.0,
           metrics: Metrics | None = None) -> Pruner:
    settings = RetentionSettings(work_days=WORK_DAYS, facts_days=FACTS_DAYS,
                                 batch_rows=batch_rows, batch_bytes=batch_bytes,
                                 lease_ttl=lease_ttl)
    return Pruner(store, settings, FixedClock(now_us), metrics or Metrics(), holder,
                  ingress_days=INGRESS_DAYS)


async def prune(store: WorkStore, now_us: int, **kw: Any) -> dict[str, Any]:
    summary = await pruner(store, now_us, **kw).pass_once()
    assert summary is not None and summary["result"] == "done", summary
    return summary


async def count(store: WorkStore, table: str, where: str = "1 = 1",
                params: tuple[Any, ...] = ()) -> int:
    async def body(tx: Any) -> int:
        rows = await tx.fetchall(f"SELECT COUNT(*) FROM {table} WHERE {where}", params)
        return int(rows[0][0])

    return await store.db.transact(body, name="test.count", write=False)


async def ids(store: WorkStore, table: str, column: str) -> set[str]:
    async def body(tx: Any) -> set[str]:
        return {str(r[0]) for r in await tx.fetchall(f"SELECT {column} FROM {table}")}

    return await store.db.transact(body, name="test.ids", write=False)
