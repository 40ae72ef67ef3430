"""Cursor reconciliation's pure decisions: pages, horizon, cursor, keys."""

from __future__ import annotations

from typing import Any

import pytest

from daemon.core.cursor import (
    BadPage,
    Cursor,
    Listed,
    Stream,
    iso_from_ns,
    lag_seconds,
    parse_rows,
    plan_page,
    since_ns,
    sync_lag_seconds,
)
from daemon.core.inbound_flow import remote_time_ns

STREAM = Stream(provider="outreach", binding="b1", resource="prospect",
                resource_type="prospect")
S = 1_000_000_000


def at(text: str) -> int:
    value = remote_time_ns(text)
    assert value is not None
    return value


def row(record_id: str, updated_at: str, **attributes: Any) -> Listed:
    return Listed(record_id=record_id, updated_at=updated_at, updated_ns=at(updated_at),
                  attributes=attributes)


T5 = "2030-01-01T00:00:05.000Z"
T6 = "2030-01-01T00:00:06.000Z"
FAR = at("2031-01-01T00:00:00Z")


def test_a_page_produces_one_observed_change_per_record_and_moves_the_cursor() -> None:
    plan = plan_page(STREAM, [row("1", T5, title="a"), row("2", T6)], cursor=None,
                     horizon_ns=FAR)
    assert [(c.resource_id, c.kind, c.origin, c.remote_updated_at) for c in plan.changes] == [
        ("1", "observed", "reconcile", T5), ("2", "observed", "reconcile", T6)]
    assert plan.changes[0].attributes == {"title": "a"}
    assert plan.cursor == Cursor(updated_ns=at(T6), updated_at=T6, record_id="2")
    assert not plan.done


def test_equal_timestamps_across_pages_and_runs_are_neither_skipped_nor_doubled() -> None:
    """25 records share one updatedAt; pages of 7 cut through them; the provider may break
    ties in any order; a crash re-reads a page; the next run overlaps. The set of dedupe
    keys produced is exactly one per record."""
    run = [row(str(n), T5) for n in (3, 1, 2, 25, 24, *range(4, 24))]
    keys: list[str] = []
    cursor = None
    for start in range(0, len(run), 7):
        page = run[start:start + 7]
        plan = plan_page(STREAM, page, cursor=cursor, horizon_ns=FAR)
        keys += [c.dedupe_key for c in plan.changes]
        if start == 7:  # a crash before the checkpoint: the same page again
            keys += [c.dedupe_key for c in plan_page(STREAM, page, cursor=cursor,
                                                     horizon_ns=FAR).changes]
        cursor = plan.cursor or cursor
    assert cursor is not None and cursor.record_id == "25"  # the greatest (time, id)
    # The next run starts at or before the shared time: all 25 are listed again.
    assert since_ns(cursor, overlap_ns=60 * S) <= at(T5)
    keys += [c.dedupe_key for c in plan_page(STREAM, run, cursor=cursor,
                                             horizon_ns=FAR).changes]
    assert len(set(keys)) == 25
    assert all(k.startswith("inbound:reconcile:b1:prospect:") for k in keys)


def test_records_past_the_horizon_end_the_run_and_stay_for_the_next() -> None:
    plan = plan_page(STREAM, [row("1", T5), row("2", T6)], cursor=None,
                     horizon_ns=at(T5) + 1)
    assert [c.resource_id for c in plan.changes] == ["1"]
    assert plan.done and plan.cursor is not None and plan.cursor.record_id == "1"


def test_a_bounded_repair_stops_at_until_and_keys_by_its_run() -> None:
    plan = plan_page(STREAM, [row("1", T5), row("2", T6)], cursor=None, horizon_ns=FAR,
                     until_ns=at(T5), origin="repair", run_id="rep1")
    assert [c.dedupe_key for c in plan.changes] == [f"inbound:repair:rep1:b1:prospect:{T5}:1"]
    assert plan.done


def test_the_cursor_never_moves_back() -> None:
    cursor = Cursor(updated_ns=at(T6), updated_at=T6, record_id="9")
    plan = plan_page(STREAM, [row("1", T5)], cursor=cursor, horizon_ns=FAR)
    assert plan.cursor is None  # unchanged
    assert Cursor(updated_ns=1, updated_at="", record_id="10").key() > Cursor(
        updated_ns=1, updated_at="", record_id="9").key()


def test_since_and_lag() -> None:
    assert since_ns(None, 60 * S, floor_ns=5) == 5
    cursor = Cursor(updated_ns=at(T6), updated_at=T6, record_id="1")
    assert iso_from_ns(since_ns(cursor, 1 * S)) == T5
    assert iso_from_ns(at("2030-01-01T00:00:05.123999999Z")) == "2030-01-01T00:00:05.123Z"
    assert lag_seconds(cursor, at(T6) + 3 * S) == 3.0
    assert lag_seconds(None, 0) is None


def _find(name: str) -> Any:
    return lambda item: item.get(name) if isinstance(item, dict) else None


@pytest.mark.parametrize("items", [
    None, {"id": 1}, [{"id": 1, "attributes": {}}], [{"id": True, "updatedAt": T5,
                                                      "attributes": {}}],
    [{"id": 1, "updatedAt": "soon", "attributes": {}}],
    [{"id": 1, "updatedAt": T5, "attributes": []}],
])
def test_a_bad_page_is_a_clear_error(items: Any) -> None:
    with pytest.raises(BadPage):
        parse_rows(items, id_of=_find("id"), attributes_of=_find("attributes"),
                   updated_of=_find("updatedAt"))


def test_rows_parse_with_integer_ids() -> None:
    (parsed,) = parse_rows([{"id": 7, "updatedAt": T5, "attributes": {"a": 1}}],
                           id_of=_find("id"), attributes_of=_find("attributes"),
                           updated_of=_find("updatedAt"))
    assert (parsed.record_id, parsed.updated_ns) == ("7", at(T5))


@pytest.mark.parametrize(("last_run_us", "safety_lag_s", "now_s", "lag"), [
    (100_000_000, 30.0, 200.0, 130.0),   # complete through 70 s; now 200 s
    (100_000_000, 0.0, 100.0, 0.0),      # just ran, no safety lag
    (100_000_000, 30.0, 50.0, 0.0),      # a clock behind the run: never negative
    (None, 30.0, 200.0, None),           # never ran
    (100_000_000, None, 200.0, None),    # no reconcile policy for the stream
])
def test_sync_lag_is_time_since_last_known_complete(
        last_run_us: int | None, safety_lag_s: float | None, now_s: float,
        lag: float | None) -> None:
    assert sync_lag_seconds(last_run_us, safety_lag_s, now_s) == lag
