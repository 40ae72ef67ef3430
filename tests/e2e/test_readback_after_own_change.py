"""A read-back proves a lost PATCH absent when the record still carries the last-modified
time of our own earlier accepted change (issue 12's torture finding).

Commands on one Lead run back to back. When the second PATCH meets a 5xx that applied
nothing, the record was last modified by the first one, within the provider's clock-skew
margin of the second dispatch: the time rule (modified before the dispatch, minus the
skew) can never prove the loss, and the Lead's lane waited for an operator. But the first
PATCH's own answer named the record's new last-modified time. A record that still shows
exactly that time was not modified since, so not by the lost PATCH either: absent. A
record some other writer changed meanwhile shows another time and proves nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from daemon.core.states import WorkState
from sandbox.hubspot_sim import Fault
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.l1 import write_sandbox_definitions
from tests.support.slice import Slice, running_slice

pytestmark = pytest.mark.slow

# Far longer than the test: the time rule alone can never prove anything here.
SKEW_S = 600.0


@asynccontextmanager
async def _slice_whose_next_patch_is_lost(database: FreshDatabase, store: WorkStore,
                                          tmp_path: Path) -> AsyncIterator[Slice]:
    """Lead-1's first title change committed (our own accepted change on contact 101),
    and a 500 that applies nothing armed for its next PATCH."""
    l1 = write_sandbox_definitions(tmp_path / "l1", max_clock_skew=SKEW_S)
    async with running_slice(store, database.url, definitions_dir=str(l1)) as sl:
        await sl.lead("lead-1", "101")
        first = await sl.set_title("lead-1", "CTO")
        await sl.wait_intent("lead-1", first, "COMMITTED")
        sl.sim.inject(Fault(mode="status", method="PATCH", status=500))
        yield sl


async def test_a_lost_patch_after_our_own_change_is_proven_absent_and_sent_again(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    async with _slice_whose_next_patch_is_lost(database, store, tmp_path) as sl:
        second = await sl.set_title("lead-1", "CEO")
        await sl.wait_intent("lead-1", second, "COMMITTED", within_s=60)
        patches = [r.status for r in sl.sim.requests if r.method == "PATCH"]
        assert patches == [200, 500, 200]
        contact = sl.sim.contact("101")
        assert contact is not None
        assert (contact["properties"]["jobtitle"], contact["patches_applied"]) == ("CEO", 2)


async def test_a_record_another_writer_changed_meanwhile_proves_nothing(
    database: FreshDatabase, store: WorkStore, tmp_path: Path
) -> None:
    async with _slice_whose_next_patch_is_lost(database, store, tmp_path) as sl:
        # Another writer (a person in HubSpot) changes the contact while the PATCH is lost.
        sl.sim.change_contact("101", email="someone@example.com")
        await sl.set_title("lead-1", "CEO")

        async def waits_for_an_operator() -> bool:
            items = await store.work_list(WorkQuery(family="external_effect"))
            return any("operator disposition needed" in (i.operator_summary or "")
                       for i in items)

        await wait_for(waits_for_an_operator, within_s=60)
        items = await store.work_list(WorkQuery(family="external_effect"))
        blocked = [i for i in items if i.state is not WorkState.SUCCEEDED]
        assert [i.failure_class for i in blocked] == ["outcome_unknown"]
        assert [r.status for r in sl.sim.requests if r.method == "PATCH"] == [200, 500]
