"""Conformance: the orgs with ready work that a busy claim loop rotates through
(``work_ready_orgs``, fair-share claiming), on every backend; and on MariaDB, that finding
them reads the index one seek per org, not the family's whole ready set."""

from __future__ import annotations

import pytest

from daemon.core.outcomes import RetryLater
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, backend_params
from tests.support.work import SEC, T0, claim, enqueue, finalize


async def _ready_set(store: WorkStore) -> None:
    """org-a: pending, ready since T0-5 s. org-b: pending in the future, and a retry ready
    since its backoff. org-c: pending, only in the future. org-d: claimed (processing).
    org-e: ready, but of another family. org-f: pending, ready since T0-1 s."""
    await enqueue(store, 2, now=T0, org_id="org-a", run_after_us=T0 - 5 * SEC)
    await enqueue(store, 1, now=T0, org_id="org-b", run_after_us=T0 + 3600 * SEC)
    await enqueue(store, 1, now=T0, org_id="org-c", run_after_us=T0 + 3600 * SEC)
    await enqueue(store, 1, now=T0, org_id="org-e", family="cursor_reconcile",
                  run_after_us=T0 - 9 * SEC)
    await enqueue(store, 1, now=T0, org_id="org-f", run_after_us=T0 - SEC)
    (wid,) = await enqueue(store, 1, now=T0 - 100 * SEC, org_id="org-d",
                           run_after_us=T0 - 100 * SEC)
    # org-d's item claimed alone (the oldest); org-b's retry: claimed, then retried.
    (held,) = (await claim(store, "A", now=T0 - 100 * SEC, limit=1)).claimed
    assert held.work_id == wid
    (retried,) = await enqueue(store, 1, now=T0 - 200 * SEC, org_id="org-b",
                               run_after_us=T0 - 200 * SEC)
    (item,) = (await claim(store, "A", now=T0 - 200 * SEC, limit=1)).claimed
    assert item.work_id == retried
    assert (await finalize(store, item, RetryLater("x", "y"), now=T0 - 200 * SEC)).applied


@pytest.mark.parametrize(("limit", "expected"), [
    # Oldest first: org-b's retry became ready at its backoff (well before T0-5 s).
    (64, ["org-b", "org-a", "org-f"]),
    # Per state, the first `limit` orgs in org order with a ready row: pending gives
    # org-a, retry org-b; the older of the two is kept.
    (1, ["org-b"]),
    (2, ["org-b", "org-a"]),
])
async def test_ready_orgs_are_the_orgs_with_a_ready_row_oldest_first(
        store: WorkStore, limit: int, expected: list[str]) -> None:
    await _ready_set(store)
    assert await store.work_ready_orgs("noop", T0, limit=limit) == expected


async def test_no_ready_row_no_org(store: WorkStore) -> None:
    assert await store.work_ready_orgs("noop", T0) == []
    await enqueue(store, 3, now=T0, org_id="org-c", run_after_us=T0 + SEC)
    assert await store.work_ready_orgs("noop", T0) == []
    assert await store.work_ready_orgs("noop", T0 + SEC) == ["org-c"]


async def _index_entries_read(store: WorkStore) -> int:
    async def read(tx: SqlTx) -> int:
        ((_, value),) = await tx.fetchall("SHOW SESSION STATUS LIKE 'Handler_read_next'")
        return int(value)

    return int(await store.db.transact(read, name="test.status", write=False))


@pytest.mark.parametrize("backend", backend_params(["mysql", "galera"]))
async def test_finding_the_orgs_does_not_read_the_ready_set(database: FreshDatabase) -> None:
    """Before the walk, one GROUP BY read every ready row of the family (here 3,002
    entries for 3 orgs), and every busy claim loop of every replica asked every 2 s."""
    store = await database.open_store(pool_size=1)  # one connection: its session counters
    await enqueue(store, 3000, now=T0, org_id="org-big", run_after_us=T0 - SEC)
    await enqueue(store, 1, now=T0, org_id="org-a", run_after_us=T0 - 2 * SEC)
    await enqueue(store, 1, now=T0, org_id="org-z", run_after_us=T0 - 3 * SEC)
    before = await _index_entries_read(store)
    assert await store.work_ready_orgs("noop", T0) == ["org-z", "org-a", "org-big"]
    read = await _index_entries_read(store) - before
    assert read < 100, read
