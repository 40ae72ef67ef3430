"""Conformance: the depth sampler's counts are bounded (a deep queue is "at least N")."""

from __future__ import annotations

import pytest

from daemon.core.states import WorkState
from storage import work_admin
from storage.port import QueueDepth
from storage.work_store import WorkStore
from tests.support.work import T0, enqueue


async def test_depths_stop_counting_at_the_cap(store: WorkStore,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work_admin, "DEPTH_COUNT_CAP", 3)
    await enqueue(store, 5, now=T0)
    await enqueue(store, 2, now=T0 + 7, family="external_effect", subject_kind="command")
    assert await store.work_depths() == [
        QueueDepth("external_effect", WorkState.PENDING, 2, T0 + 7, capped=False),
        QueueDepth("noop", WorkState.PENDING, 3, T0, capped=True),
    ]


async def test_an_empty_table_has_no_depths(store: WorkStore) -> None:
    assert await store.work_depths() == []
