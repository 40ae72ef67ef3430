"""The assembled replay guard refuses to replay an intent that a newer, already settled
intent for the same field superseded (issue 8 item 9), on real storage."""

from __future__ import annotations

import pytest

from daemon.services.assembly import assemble
from daemon.services.clock import WallClock
from daemon.services.operator_api import replay
from storage.port import WorkConflict, WorkQuery
from storage.work_store import WorkStore
from tests.storage.test_effect_lanes import _settled_newer
from tests.support.slice import slice_settings
from tests.ui.support import _OPERATORS


async def test_replaying_a_superseded_intent_is_refused_with_the_reason(
    store: WorkStore,
) -> None:
    old, new = await _settled_newer(store)
    settings = slice_settings(api_port=0, runtime_url="http://127.0.0.1:9",
                              hubspot_url="http://127.0.0.1:9", url="", operators=_OPERATORS)
    parts = assemble(settings, store, WallClock())
    try:
        (dead,) = [i for i in await store.work_list(WorkQuery(family="external_effect"))
                   if i.subject_id == old]
        with pytest.raises(WorkConflict, match="a newer intent") as refused:
            await replay(store, settings, parts.registry, WallClock(), work_id=dead.work_id,
                         actor="otto", reason="send the old title again")
        assert new in str(refused.value) and "jobtitle" in str(refused.value)
        assert await store.work_replays_of(dead.work_id) == []
    finally:
        await parts.aclose()

