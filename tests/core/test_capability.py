"""Which work a build may run: engine capability and payload schema bounds (table-driven)."""

from __future__ import annotations

import pytest

from daemon.core.capability import ENGINE_CAPABILITY_VERSION, hold_reason


@pytest.mark.parametrize(
    ("item_engine", "item_schema", "engine", "schema", "held"),
    [
        (1, 1, 1, 1, None),
        (1, 1, 2, 3, None),  # older work runs on a newer build
        (2, 2, 2, 2, None),
        (2, 1, 1, 1, "engine capability v2; this build runs v1"),
        (3, 1, 2, 9, "engine capability v3; this build runs v2"),
        (1, 2, 1, 1, "payload schema v2 is newer than this build's handler reads (v1)"),
        (1, 5, 3, 4, "payload schema v5 is newer than this build's handler reads (v4)"),
        # A newer engine is named first when both are too new.
        (2, 2, 1, 1, "engine capability v2"),
    ],
)
def test_hold_reason(item_engine: int, item_schema: int, engine: int, schema: int,
                     held: str | None) -> None:
    reason = hold_reason(item_engine=item_engine, item_schema=item_schema, engine=engine,
                         schema=schema)
    if held is None:
        assert reason is None
    else:
        assert reason is not None and held in reason and "left for a replica" in reason


def test_work_written_by_this_build_runs_on_it() -> None:
    assert hold_reason(item_engine=ENGINE_CAPABILITY_VERSION, item_schema=1) is None
    assert hold_reason(item_engine=ENGINE_CAPABILITY_VERSION + 1, item_schema=1) is not None
