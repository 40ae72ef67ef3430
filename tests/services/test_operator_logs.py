"""Logs an operator can read (issue 23 item 4), under MockClock on a real SQLite store.

Every retry and dead item is one WARNING line naming its family, item, class and reason;
routine successes are DEBUG, and one ``activity`` INFO line per interval says what the
replica did.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from config.settings import FamilySettings
from daemon.core.states import WorkState
from daemon.services.activity_log import movement, snapshot, summary_fields
from daemon.services.logs import LOGGER_NAME, JsonLineFormatter
from daemon.services.metrics import Metrics
from storage.work_store import WorkStore
from tests.support.backends import fresh_database
from tests.support.harness import running_replica, settings, wait_for
from tests.support.work import spec


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[WorkStore]:
    async with fresh_database("sqlite", tmp_path) as tdb:
        yield await tdb.open_store()


def _now_us() -> int:
    from daemon.services.clock import TrioClock

    return TrioClock().now_us()


def _lines(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[dict[str, object]]:
    """The records as the JSON lines journald would keep."""
    fmt = JsonLineFormatter()
    return [json.loads(fmt.format(r)) for r in caplog.records
            if r.name == LOGGER_NAME and (level is None or r.levelno == level)]


async def test_every_retry_and_dead_item_is_one_warning_naming_family_item_class_reason(
    store: WorkStore, autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER_NAME)
    (wid,) = [r.work_id for r in await store.work_enqueue(
        [spec(payload='{"fail_attempts": 99}', max_attempts=2)], _now_us())]
    cfg = settings({"noop": FamilySettings(backoff_base=0.5, backoff_cap=1.0)})
    async with running_replica(store, cfg):
        async def dead() -> bool:
            item = await store.work_get(wid)
            return item is not None and item.state is WorkState.DEAD

        await wait_for(dead)
    warnings = [d for d in _lines(caplog, logging.WARNING) if d.get("work_id") == wid]
    assert [d["event"] for d in warnings] == ["work_retry", "work_dead"]
    item = await store.work_get(wid)
    assert item is not None
    for line in warnings:
        assert line["family"] == "noop" and line["max_attempts"] == 2
        assert line["failure_class"] == item.failure_class
        assert isinstance(line["reason"], str) and line["reason"]
    assert warnings[1]["reason"] == item.operator_summary
    assert [d["attempt"] for d in warnings] == [1, 2]


async def test_routine_work_is_one_activity_line_per_interval_not_a_line_per_item(
    store: WorkStore, autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    await store.work_enqueue([spec() for _ in range(40)], _now_us())
    async with running_replica(store, settings()):
        await wait_for(lambda: _none_open(store))
        caplog.clear()

        async def summarized() -> bool:
            return any(d["event"] == "activity" for d in _lines(caplog))

        await wait_for(summarized, within_s=120)
        # Up to the summary, nothing at INFO or above: no line per item.
        (activity,) = _lines(caplog)
    assert activity["event"] == "activity"
    assert activity["level"] == "info" and activity["interval_s"] == 60.0
    assert activity["finalized.noop.succeeded"] == 40
    assert activity["finalized_total"] == 40


async def _none_open(store: WorkStore) -> bool:
    return await store.work_count_open() == 0


def test_the_summary_counts_what_moved_by_label_set_and_kind() -> None:
    metrics = Metrics()
    before = snapshot(metrics)
    metrics.finalized.labels("noop", "succeeded").inc(3)
    metrics.finalized.labels("noop", "dead").inc()
    metrics.count_receipt("confirmed")
    after = snapshot(metrics)
    moved = movement(before, after)
    assert moved == {"finalized.noop.dead": 1, "finalized.noop.succeeded": 3,
                     "receipts.confirmed": 1}
    assert summary_fields(moved) == {"finalized_total": 4, "receipts_total": 1, **moved}
    assert movement(after, snapshot(metrics)) == {}, "nothing moved: no line"
