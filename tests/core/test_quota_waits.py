"""When an item's wait for quota began, table-driven (daemon/core/quota_waits.py)."""

from __future__ import annotations

import pytest

from daemon.core.quota_waits import JournalEntry, waiting_since


def e(epoch: int, outcome: str, at: int, reason: str | None = None) -> JournalEntry:
    return JournalEntry(epoch, outcome, reason, at)


@pytest.mark.parametrize(("journal", "since"), [
    ([], None),
    ([e(1, "deferred", 10, "quota_wait")], 10),
    ([e(1, "deferred", 10, "quota_wait"), e(2, "deferred", 20, "quota_wait")], 10),
    # Order of the rows does not matter: the epochs do.
    ([e(3, "deferred", 30, "quota_wait"), e(2, "deferred", 20, "quota_wait")], 20),
    # A retry in between ends the earlier wait.
    ([e(1, "deferred", 10, "quota_wait"), e(2, "retry", 15), e(3, "deferred", 30,
                                                                "quota_wait")], 30),
    # Negative rows: the newest execution is not a quota deferral.
    ([e(1, "deferred", 10, "quota_wait"), e(2, "retry", 15)], None),
    ([e(1, "deferred", 10, "grant_wait")], None),
    ([e(1, "lease_lost", 10)], None),
])
def test_waiting_since(journal: list[JournalEntry], since: int | None) -> None:
    assert waiting_since(journal) == since
