"""Conformance: the rollback-only states (seed 11.1)."""

from __future__ import annotations

import pytest

from daemon.core.outcomes import Released
from daemon.core.states import WorkState
from storage.port import WorkConflict
from storage.work_rollback import LegacyReceipt
from storage.work_store import WorkStore
from tests.support.work import T0, claim, enqueue, finalize


async def test_rollback_fence_waits_for_zero_processing(store: WorkStore) -> None:
    await enqueue(store, 3)
    (item,) = (await claim(store, limit=1)).claimed
    with pytest.raises(WorkConflict, match="1 noop items are processing"):
        await store.work_rollback_fence("noop", "fence-1", T0)
    await finalize(store, item, Released())
    assert await store.work_rollback_fence("noop", "fence-1", T0) == 3
    assert (await claim(store)).claimed == []  # fenced rows are not executable
    assert await store.work_cutover_blockers("noop") == 3


async def test_legacy_receipts_reconcile_idempotently(store: WorkStore) -> None:
    a, b, c = await enqueue(store, 3)
    await store.work_rollback_fence("noop", "fence-1", T0)
    receipt = LegacyReceipt(a, "fence-1", 1, "sha256:aa")
    assert await store.work_legacy_reconcile(receipt, T0) is WorkState.RECONCILED_LEGACY_TERMINAL
    # The same receipt again is fine; a different one is a conflict.
    assert await store.work_legacy_reconcile(receipt, T0) is WorkState.RECONCILED_LEGACY_TERMINAL
    with pytest.raises(WorkConflict):
        await store.work_legacy_reconcile(LegacyReceipt(a, "fence-1", 1, "sha256:bb"), T0)
    with pytest.raises(WorkConflict):
        await store.work_legacy_reconcile(LegacyReceipt(b, "other-fence", 1, "sha256:aa"), T0)
    await store.work_legacy_unknown(c, "fence-1", T0)
    with pytest.raises(WorkConflict):
        await store.work_legacy_unknown(a, "fence-1", T0)  # already terminal
    # b awaits and c is unknown: re-cutover stays blocked.
    assert await store.work_cutover_blockers("noop") == 2
    await store.work_legacy_reconcile(LegacyReceipt(b, "fence-1", 1, "sha256:cc"), T0)
    assert await store.work_cutover_blockers("noop") == 1
    states = {i: (await store.work_get(i)).state for i in (a, b, c)}  # type: ignore[union-attr]
    assert states == {
        a: WorkState.RECONCILED_LEGACY_TERMINAL,
        b: WorkState.RECONCILED_LEGACY_TERMINAL,
        c: WorkState.LEGACY_OUTCOME_UNKNOWN,
    }


async def test_dispatch_history_blocks_rollback(store: WorkStore) -> None:
    from storage.effect_values import AttemptDraft
    from tests.support.commands import accept_pinned, dispatch_pins, draft

    accepted = await accept_pinned(store, draft(), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect")).claimed
    assert item.fence is not None
    await store.effect_checkpoint(item.fence, AttemptDraft(
        command_id=accepted.command_id, method="PATCH", target_path="/x", safe_headers="{}",
        body_sha256="sha256:" + "0" * 64, idempotency_key="k", pre_dispatch_evidence="{}",
        pins=dispatch_pins()), lambda: T0)
    await finalize(store, item, Released())  # back to retry, with an attempt on record
    with pytest.raises(WorkConflict, match="dispatch history"):
        await store.work_rollback_fence("external_effect", "fence-1", T0)
    assert await store.work_cutover_blockers("external_effect") == 0
