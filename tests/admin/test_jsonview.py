"""JSON on a page: exact digits shown, microseconds read on hover (admin_ui/jsonview.py)."""

from __future__ import annotations

from typing import Any

import pytest

from admin_ui.jsonview import json_tokens

ULID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


@pytest.mark.parametrize(("value", "shown", "title"), [
    ({"created_at_us": 1_800_000_000_000_000}, "1800000000000000", "2027-01-15 08:00:00Z"),
    ({"window_us": 10_000_000}, "10000000", "10 s"),
    ({"lease_ttl_us": 2500}, "2500", "2.5 ms"),
    # Negative rows: not a microsecond key, or not a number.
    ({"count": 1_800_000_000_000_000}, None, None),
    ({"note_us": "1800000000000000"}, None, None),
])
def test_microsecond_values_keep_their_digits_and_read_on_hover(
        value: dict[str, Any], shown: str | None, title: str | None) -> None:
    tokens = json_tokens(value)
    titled = [t for t in tokens if t["title"]]
    assert [(t["text"], t["title"]) for t in titled] == (
        [] if shown is None else [(shown, title)])
    assert "".join(str(t["text"]) for t in tokens).replace("\n", "").replace(" ", "") == (
        str(value).replace("'", '"').replace(" ", ""))


def test_work_ids_stay_links() -> None:
    tokens = json_tokens({"work_id": ULID, "at_us": 1_800_000_000_000_000})
    assert [t["work_id"] for t in tokens if t["work_id"]] == [ULID]
