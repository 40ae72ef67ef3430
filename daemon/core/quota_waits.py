"""How long a work item has been held on quota (pure: no I/O, no clock read).

An item whose provider quota key has no send slot is deferred: its claim is given back
unstarted until a slot is due, its attempt refunded, and the execution journal keeps
one ``deferred`` entry with reason ``quota_wait`` per turn. Its wait began at the first
deferral of its current unbroken run of them: an execution that did anything else
(a retry, a lease lost) ends an earlier wait.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

DEFERRED = "deferred"
QUOTA_WAIT = "quota_wait"


@attrs.frozen
class JournalEntry:
    epoch: int
    outcome: str
    reason: str | None
    finished_at_us: int


def waiting_since(journal: Iterable[JournalEntry]) -> int | None:
    """When the item's current wait for quota began (None: it is not held on quota)."""
    since = None
    for entry in sorted(journal, key=lambda e: e.epoch, reverse=True):
        if entry.outcome != DEFERRED or entry.reason != QUOTA_WAIT:
            break
        since = entry.finished_at_us
    return since
