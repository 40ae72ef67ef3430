"""The rollback step against a real concurrent claimer (seed 11.1, section 13).

A claimer in another OS process claims the family as fast as it can while this
process, trial after trial, enqueues two items and runs the step that
``integrationd cutover rollback`` (and the console's Rollback button) performs:
:func:`daemon.services.cutover.step` with ``rollback`` -- close integrationd's
claim admission, then the atomic fence and the legacy owner's receipt -- with a
claim-transaction bound of 0, so nothing but the fence's own atomicity stands
between a claim that began before admission closed and the fence. A rollback
that reports success must leave no row of the family ``processing``: a row that
a claim moved to ``processing`` while the fence decided would execute under
integrationd after the legacy owner was admitted (the overlap seed 11.1
forbids). The step may refuse (the claimer won first) or fence everything.

Most trials fence at once, a true race. Every ``YIELD_EVERY``-th trial first
waits until the claimer has won a row, so both outcomes (the claimer first, the
fence refusing) happen on every backend by construction, not by luck: on SQLite
one writer at a time, and the claimer's busy handler sleeping while this
process writes back to back, let CI's 300 immediate trials go by with the
claimer never winning once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import trio

from config.settings import Settings
from daemon.core.cutover import Phase
from daemon.services import cutover
from storage.cutover.values import CutoverBlocked, StepParams
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.admin.support import operators
from tests.support.backends import FreshDatabase
from tests.support.work import enqueue

TRIALS = 300
YIELD_EVERY = 10
FAMILY = "noop"


def wall_us() -> int:
    return time.time_ns() // 1000


SETTINGS = Settings(operators=operators())
ROLLBACK = StepParams(family=FAMILY, actor="ada", reason="fence race", claim_tx_bound_us=0)


async def _retire_everything(store: WorkStore) -> None:
    """Between trials: the family has no executable or executing row left, and
    integrationd owns it again with admission open (as a re-cutover leaves it)."""

    async def body(tx: SqlTx) -> None:
        await tx.execute(
            "UPDATE work_items SET state = 'cancelled', target_lane_hold = NULL,"
            " lease_until_us = NULL, row_version = row_version + 1"
            " WHERE family = ? AND state IN ('pending', 'retry', 'processing',"
            " 'awaiting_legacy_outcome')",
            (FAMILY,),
        )
        await tx.execute(
            "UPDATE owner_generations SET phase = ?, claimant = 'integrationd',"
            " admission_closed_at_us = NULL, row_version = row_version + 1"
            " WHERE family = ?", (Phase.INTEGRATIOND_ACTIVE.value, FAMILY))

    await store.db.transact(body, name="test.retire")


async def _processing(store: WorkStore) -> int:
    async def body(tx: SqlTx) -> int:
        rows = await tx.fetchall(
            "SELECT COUNT(*) FROM work_items WHERE family = ? AND state = 'processing'",
            (FAMILY,),
        )
        return int(rows[0][0])

    return await store.db.transact(body, name="test.processing", write=False)


async def _until_the_claimer_won(store: WorkStore) -> None:
    # The claimer is another OS process: nothing here can signal, so poll its row.
    with trio.fail_after(60):
        while True:
            if await _processing(store):
                return
            await trio.sleep(0.001)


async def _read_line(proc: trio.Process) -> dict[str, object]:
    assert proc.stdout is not None
    data = b""
    while not data.endswith(b"\n"):
        chunk = await proc.stdout.receive_some(4096)
        assert chunk, "racer exited early"
        data += chunk
    return dict(json.loads(data))


@pytest.mark.slow
async def test_rollback_step_never_overlaps_a_concurrent_claim(
    database: FreshDatabase, store: WorkStore
) -> None:
    await store.cutover_begin(ROLLBACK, wall_us())  # the family's owner-generation row
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.support.fence_racer", database.url, FAMILY],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )
    overlaps = refused = fenced = 0
    refusals: set[tuple[str, ...]] = set()
    try:
        with trio.fail_after(600):
            await _read_line(proc)
            for trial in range(TRIALS):
                await _retire_everything(store)
                await enqueue(store, 2, now=wall_us() - 1,
                              subject_id=f"t{trial}", source_lane=None)
                if trial % YIELD_EVERY == 0:
                    await _until_the_claimer_won(store)
                try:
                    done = await cutover.step(store, SETTINGS, "rollback", ROLLBACK,
                                              wall_us())
                except CutoverBlocked as exc:
                    refusals.add(tuple(b.code for b in exc.blockers))
                    refused += 1
                    continue
                assert done[-1].generation.phase is Phase.LEGACY_ACTIVE
                fenced += 1
                if await _processing(store):
                    overlaps += 1
    finally:
        assert proc.stdin is not None
        await proc.stdin.aclose()  # the racer stops at end of input
        with trio.fail_after(60):
            out = await _read_line(proc)
            await proc.wait()
    sys.stderr.write(
        f"fence race ({database.backend}): {TRIALS} trials, {fenced} fenced,"
        f" {refused} refused, {overlaps} overlaps; racer won {out['won']}\n"
    )
    # Refused only because the claimer's row is processing, never for another reason.
    assert refusals == {("processing",)}
    assert overlaps == 0, (
        f"{overlaps} of {TRIALS} rollbacks reported success while a claim left a row"
        " processing"
    )
    # Both sides won: the claimer's head-start trials were refused, and fences
    # that ran at once went through.
    assert int(str(out["won"])) >= TRIALS // YIELD_EVERY
    assert refused >= TRIALS // YIELD_EVERY
    assert fenced > 0
