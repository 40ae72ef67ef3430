"""The replay guard is in the replay's transaction (issue 20 item 6), on real storage.

The finding: the assembled effect family's guard read the command (open, nothing
unresolved, pins current), and only then did the replay's own transaction insert the
new WorkItem: a retire committed in between left a replay of a retired command
(accepted, then skipped by the runner: "command already retired"). Here the retire is
made to commit exactly in that window, deterministically.
"""

from __future__ import annotations

import attrs
import pytest

from config.catalog import load_catalog
from daemon.core.outcomes import DeadLetter
from daemon.core.work import WorkItem
from daemon.services.assembly import assemble
from daemon.services.catalog_view import publish_current
from daemon.services.clock import WallClock
from daemon.services.operator_api import replay
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.command_repair import RepairActor
from storage.effect_values import Settlement
from storage.port import ReplayParams, WorkConflict
from storage.work_store import WorkStore
from tests.storage.test_effect_journal import record
from tests.support.commands import (
    HUBSPOT_MAIN,
    TARGETS_SCOPE_DIGEST,
    attempt,
    dispatch_pins,
    draft,
    pinned,
    target_remote,
)
from tests.support.slice import slice_settings
from tests.support.work import T0, claim, finalize
from tests.ui.support import _OPERATORS


class RetireInTheWindow(WorkStore):
    """A store whose replay transaction starts only after another operator's retire
    of the same command committed (after the family's guard read the command)."""

    retire_first: str = ""

    async def work_replay(self, params: ReplayParams, now_us: int) -> WorkItem:
        if self.retire_first:
            await self.command_retire(self.retire_first, RepairActor(
                actor="olga", role="operator", reason="give up"), receipt_max_attempts=5,
                now_us=now_us)
        return await super().work_replay(params, now_us)


async def test_a_retire_between_the_guard_and_the_replay_leaves_no_replay(
    store: WorkStore,
) -> None:
    settings = slice_settings(api_port=0, runtime_url="http://127.0.0.1:9",
                              hubspot_url="http://127.0.0.1:9", url="", operators=_OPERATORS)
    current = load_catalog(settings)
    await publish_current(store, current, actor="t", role="admin", reason="setup", now_us=T0)
    await store.binding_bootstrap(bootstrap_facts(HUBSPOT_MAIN), T0)
    # Every pin real: the link the command targets, the revision this configuration serves.
    await store.link_adopt(TARGETS_SCOPE_DIGEST, "lead", "lead-1", "contact",
                           target_remote("lead-1"), actor="t", role="admin", reason="setup",
                           now_us=T0)
    accepted = await store.command_accept(pinned(attrs.evolve(
        draft(), catalog_revision=current.revision, catalog_digest=current.digest)), T0)
    assert accepted.command_id is not None
    (item,) = (await claim(store, family="external_effect")).claimed
    assert item.fence is not None
    pins = attrs.evolve(dispatch_pins(), catalog_revision=current.revision,
                        catalog_digest=current.digest)
    attempt_id = await store.effect_checkpoint(
        item.fence, attrs.evolve(attempt(accepted.command_id), pins=pins), lambda: T0)
    # A replay-safe retry that may have applied: retired without a receipt.
    await record(store, item.fence, attempt_id, T0, outcome="REPLAY_SAFE_RETRY", status=503,
                 effect_evidence="maybe_applied")
    await finalize(store, item, DeadLetter("attempts_exhausted", "maybe applied"))
    racing = RetireInTheWindow(store.db, store.dialect)
    racing.retire_first = accepted.command_id
    parts = assemble(settings, racing, WallClock())
    try:
        with pytest.raises(WorkConflict, match=r"replay refused \(retired\)"):
            await replay(racing, settings, parts.registry, WallClock(), work_id=item.work_id,
                         actor="otto", reason="send it again")
    finally:
        await parts.aclose()
    command = await store.command_get(accepted.command_id)
    assert command is not None and command.settlement is Settlement.RETIRED
    assert await store.work_replays_of(item.work_id) == []
