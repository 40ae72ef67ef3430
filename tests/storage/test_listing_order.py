"""Newest-first pages name the index that serves them (storage.work_rows.newest_first)."""

from __future__ import annotations

from typing import Any

import pytest

from storage.work_rows import newest_first


@pytest.mark.parametrize(("equal", "clauses", "order"), [
    ([], [], "ORDER BY work_id DESC"),
    ([("state", "dead")], ["state >= ? AND state <= ?"], "ORDER BY state DESC, work_id DESC"),
    ([("state", "dead"), ("family", "noop")],
     ["state >= ? AND state <= ?", "family >= ? AND family <= ?"],
     "ORDER BY state DESC, family DESC, work_id DESC"),
    ([("state", "dead"), ("family", "noop"), ("failure_class", "x")],
     ["state >= ? AND state <= ?", "family = ?", "failure_class >= ? AND failure_class <= ?"],
     "ORDER BY state DESC, failure_class DESC, work_id DESC"),
    ([("org_id", "o"), ("state", "pending")],
     ["org_id >= ? AND org_id <= ?", "state >= ? AND state <= ?"],
     "ORDER BY org_id DESC, state DESC, work_id DESC"),
    ([("subject_id", "s")], ["subject_id >= ? AND subject_id <= ?"],
     "ORDER BY subject_id DESC, work_id DESC"),
    ([("family", "noop")], ["family >= ? AND family <= ?"],
     "ORDER BY family DESC, work_id DESC"),
    ([("org_id", "o")], ["org_id >= ? AND org_id <= ?"], "ORDER BY org_id DESC, work_id DESC"),
    # A subject's items are few: its index, the state filtered.
    ([("subject_id", "s"), ("state", "dead")],
     ["subject_id >= ? AND subject_id <= ?", "state = ?"],
     "ORDER BY subject_id DESC, work_id DESC"),
])
def test_newest_first(equal: list[tuple[str, Any]], clauses: list[str], order: str) -> None:
    got_clauses, params, got_order = newest_first(equal)
    assert (got_clauses, got_order) == (clauses, order)
    assert len(params) == sum(c.count("?") for c in clauses)
