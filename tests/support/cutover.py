"""Helpers for cutover tests."""

from __future__ import annotations

from typing import Any

from daemon.core.work import WorkSpec
from sandbox.legacy import store as legacy
from storage.cutover.values import StepParams
from storage.port import SqlTx
from storage.work_store import WorkStore


def params(family: str = "noop", bound_us: int = 0) -> StepParams:
    return StepParams(family=family, actor="alice", reason="test", claim_tx_bound_us=bound_us)


async def states(store: WorkStore, family: str = "noop") -> dict[str, int]:
    async def body(tx: SqlTx) -> dict[str, int]:
        rows = await tx.fetchall(
            "SELECT state, COUNT(*) FROM work_items WHERE family = ? GROUP BY state", (family,))
        return {str(r[0]): int(r[1]) for r in rows}

    return await store.db.transact(body, name="test.states", write=False)


async def legacy_states(store: WorkStore, family: str = "noop") -> dict[str, int]:
    out: dict[str, int] = {}
    for e in await legacy.events(store, family):
        out[e.state] = out.get(e.state, 0) + 1
    return out


def spec(family: str = "noop", **kw: Any) -> WorkSpec:
    base: dict[str, Any] = {"family": family, "org_id": "org-1", "subject_kind": "lead",
                            "subject_id": "lead-1"}
    base.update(kw)
    return WorkSpec(**base)
