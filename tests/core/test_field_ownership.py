"""Only outbound-owned fields may be sent (daemon/core/field_ownership.py), table-driven."""

from __future__ import annotations

import pytest

from daemon.core.field_ownership import (
    INBOUND_OWNED,
    NOT_MAPPED,
    Ownership,
    outbound_refusal,
)

OWNERSHIP = Ownership(inbound=frozenset({"firstName", "company"}),
                      outbound=frozenset({"title", "phone"}))


@pytest.mark.parametrize(("fields", "refusal"), [
    (["title"], None),
    (["title", "phone"], None),
    ([], None),
    (["firstName"], (INBOUND_OWNED, "firstName")),
    (["title", "company"], (INBOUND_OWNED, "company")),
    (["stage"], (NOT_MAPPED, "stage")),
    # The first offending field in sorted order, whatever the command's order.
    (["stage", "company"], (INBOUND_OWNED, "company")),
    (["company", "stage"], (INBOUND_OWNED, "company")),
    (["title", "addressCity", "firstName"], (NOT_MAPPED, "addressCity")),
])
def test_only_outbound_owned_fields_pass(fields: list[str],
                                         refusal: tuple[str, str] | None) -> None:
    got = outbound_refusal(fields, OWNERSHIP)
    assert (None if got is None else (got.code, got.field)) == refusal
    if got is not None:
        assert got.field in got.sentence
