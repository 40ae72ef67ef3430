"""A Hypothesis stateful test of the kernel against a real database.

Three claimants claim, renew and finalize three items while time moves and
operators cancel and replay. After every step, against the rows themselves:

* at most one claimant holds a live lease on an item;
* an item's ownership epoch never decreases;
* a terminal item stays terminal (same state, same epoch);
* a fenced write is applied exactly when the model says the fence is live.

Hypothesis drives the machine from a worker thread; each step calls back into
the test's trio loop (``trio.from_thread.run``), so the same machine runs on
every backend with its real connections.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from daemon.core.outcomes import DeadLetter, Deferred, Released, RetryLater, Succeeded
from daemon.core.states import TERMINAL, WorkState
from daemon.core.work import WorkItem
from storage.port import ClaimParams, ReplayParams, SqlTx, WorkConflict, WorkQuery
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, enqueue, finalization

T = TypeVar("T")
OWNERS = ("A", "B", "C")
TTL = 10 * SEC
OUTCOMES = [Succeeded(), RetryLater("net"), DeadLetter("bad"), Released(),
            Deferred("quota_wait", T0 + 3 * SEC)]


def _call(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    return trio.from_thread.run(fn, *args)


async def _wipe(store: WorkStore) -> None:
    async def body(tx: SqlTx) -> None:
        for table in ("work_items", "work_executions", "work_source_lanes", "audit_log"):
            await tx.execute(f"DELETE FROM {table}")

    await store.db.transact(body, name="test.wipe")


class KernelMachine(RuleBasedStateMachine):
    store: WorkStore

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.held: dict[str, dict[str, WorkItem]] = {o: {} for o in OWNERS}
        self.epochs: dict[str, int] = {}
        self.terminal: dict[str, tuple[WorkState, int]] = {}
        # Each run starts from an empty queue with three items whose order is
        # fixed (distinct run_after), so a failing run replays the same way.
        _call(_wipe, self.store)
        self.order: list[str] = []
        for i in range(3):
            self.order += _call(partial(enqueue, self.store, 1, self.now,
                                        run_after_us=self.now + i))
        self.ids = set(self.order)

    def _rows(self) -> dict[str, WorkItem]:
        items = _call(self.store.work_list, WorkQuery(limit=1000))
        return {i.work_id: i for i in items if i.work_id in self.ids}

    @staticmethod
    def _live(row: WorkItem, held: WorkItem, now: int) -> bool:
        return (
            row.state is WorkState.PROCESSING
            and row.lease_token == held.lease_token
            and row.ownership_epoch == held.ownership_epoch
            and row.lease_until_us is not None
            and row.lease_until_us >= now
        )

    @rule(owner=st.sampled_from(OWNERS), limit=st.integers(1, 3))
    def claim(self, owner: str, limit: int) -> None:
        result = _call(
            self.store.work_claim,
            ClaimParams(family="noop", owner=owner, limit=limit, lease_ttl_us=TTL,
                        window=limit * 4, include_expired=True),
            self.now,
        )
        for item in result.claimed:
            if item.work_id in self.ids:
                assert item.work_id not in self.terminal, "claimed a terminal item"
                self.held[owner][item.work_id] = item

    @rule(owner=st.sampled_from(OWNERS))
    def renew(self, owner: str) -> None:
        mine = list(self.held[owner].values())
        if not mine:
            return
        rows = self._rows()
        expected = {i.work_id for i in mine if self._live(rows[i.work_id], i, self.now)}
        now = self.now
        result = _call(self.store.work_renew_if_owner, [i.fence for i in mine], TTL,
                       lambda: now)
        assert set(result.renewed) == expected

    @rule(owner=st.sampled_from(OWNERS), pick=st.integers(0, 2),
          outcome=st.sampled_from(OUTCOMES))
    def finalize(self, owner: str, pick: int, outcome: Any) -> None:
        mine = sorted(self.held[owner].values(), key=lambda i: self.order.index(i.work_id))
        if not mine:
            return
        item = mine[pick % len(mine)]
        live = self._live(self._rows()[item.work_id], item, self.now)
        now = self.now
        (result,) = _call(self.store.work_finalize_if_owner,
                          [finalization(item, outcome, now)], owner, lambda: now)
        assert result.applied == live, "fenced write applied iff the fence was live"
        del self.held[owner][item.work_id]

    @rule(seconds=st.integers(0, 25))
    def advance(self, seconds: int) -> None:
        self.now += seconds * SEC

    @rule(pick=st.integers(0, 5))
    def cancel(self, pick: int) -> None:
        _call(self.store.work_cancel, self.order[pick % len(self.order)], self.now)

    @rule(pick=st.integers(0, 5))
    def replay(self, pick: int) -> None:
        ids = [w for w in self.order if w in self.terminal]
        if not ids:
            return
        wid = ids[pick % len(ids)]
        try:
            new = _call(self.store.work_replay,
                        ReplayParams(work_id=wid, actor="op", role="operator", reason="r"),
                        self.now)
        except WorkConflict:
            return  # already replayed
        assert new.replay_of == wid
        self.ids.add(new.work_id)
        self.order.append(new.work_id)

    @invariant()
    def kernel_invariants(self) -> None:
        rows = self._rows()
        for wid, row in rows.items():
            holders = [o for o in OWNERS
                       if wid in self.held[o] and self._live(row, self.held[o][wid], self.now)]
            assert len(holders) <= 1, f"{wid} has live leases for {holders}"
            assert row.ownership_epoch >= self.epochs.get(wid, 0), "epoch went backwards"
            self.epochs[wid] = row.ownership_epoch
            if wid in self.terminal:
                assert (row.state, row.ownership_epoch) == self.terminal[wid], "terminal reopened"
            elif row.state in TERMINAL:
                self.terminal[wid] = (row.state, row.ownership_epoch)


async def test_kernel_state_machine(store: WorkStore) -> None:
    KernelMachine.store = store

    def run() -> None:
        run_state_machine_as_test(
            KernelMachine,
            settings=settings(max_examples=60, stateful_step_count=40, deadline=None,
                              suppress_health_check=list(HealthCheck)),
        )

    await trio.to_thread.run_sync(run)
