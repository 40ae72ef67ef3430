"""Our own quota never kills work (issue 20 item 4).

A send slot is a time window: a request that waits past it for something of *ours* (a
free connection to the provider, the send gate, the dispatch checkpoint) is held back,
and nothing leaves. That wait is contention, not a failure of the provider nor of the
request: it must never spend one of the item's attempts, never end it ``dead``, and say
``quota`` where it is shown.

The whole HubSpot slice runs under trio's MockClock (SQLite, the replica on a
``TrioClock``): the simulator holds every PATCH for a second while the executor has one
connection to it, and the L1 gives the key ten send slots a second, so every claim but
the first is granted a slot that expires while it waits for that connection. With
``max_attempts = 2`` the old runner charged each expiry as a failed attempt
(``RetryLater("connect")``) and the items went ``dead`` with "attempts exhausted (2):
not applied (quota_slot_expired)", their intents never receiving a receipt.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from daemon.services.clock import TrioClock
from sandbox.hubspot_sim.model import Fault
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.harness import wait_for
from tests.support.l1 import write_sandbox_definitions
from tests.support.slice import running_slice

QUOTA = '[quota.per_app]\nlimit = 10\nwindow = 1.0\nscope = "app_installation"\n\n'
COMMANDS = 6


@pytest.fixture
def backend() -> str:
    """SQLite only: under MockClock's autojump a network adapter's own I/O deadlines jump
    too; what is under test is the runner's accounting, not a storage statement."""
    return "sqlite"


def _definitions(tmp_path: Path) -> str:
    directory = write_sandbox_definitions(tmp_path / "l1")
    hubspot = directory / "hubspot.toml"
    head, sep, rest = hubspot.read_text().partition("[auth.bearer]")
    hubspot.write_text(head + QUOTA + sep + rest)
    return str(directory)


async def test_a_slot_that_expires_waiting_for_a_connection_never_kills_the_item(
        database: FreshDatabase, store: WorkStore, tmp_path: Path,
        autojump_clock: trio.testing.MockClock) -> None:
    async with running_slice(store, database.url, max_attempts=2,
                             definitions_dir=_definitions(tmp_path), clock=TrioClock(),
                             provider_connections=1) as sl:
        leads = [f"lead-{i}" for i in range(COMMANDS)]
        for i, lead in enumerate(leads):
            await sl.lead(lead, str(100 + i))
        # Every PATCH is held a second at the provider: the one connection is busy.
        sl.sim.inject(Fault(mode="latency", method="PATCH", latency_ms=1000,
                            count=100))
        intents = [await sl.set_title(lead, "CTO") for lead in leads]

        async def settled() -> bool:
            items = await store.work_list(WorkQuery(family="external_effect"))
            return len(items) == COMMANDS and all(
                i.state.value in ("succeeded", "dead") for i in items)

        await wait_for(settled, within_s=600)
        items = await store.work_list(WorkQuery(family="external_effect"))
        dead = {i.work_id: (i.failure_class, i.operator_summary) for i in items
                if i.state.value == "dead"}
        assert dead == {}
        for lead, intent in zip(leads, intents, strict=True):
            await sl.wait_intent(lead, intent, "COMMITTED", within_s=600)
        patches = [r for r in sl.sim.requests if r.method == "PATCH"]
        assert len(patches) == COMMANDS  # one PATCH per command, none lost, none doubled
        held_back: dict[str, int] = {}
        for item in items:
            # Only the dispatch that reached the provider is an attempt; every wait for
            # the connection gave the claim back unstarted, with the class "quota".
            assert item.attempt == 1, item
            runs = await store.work_executions(item.work_id)
            waits = [r for r in runs if r.outcome == "deferred"]
            reasons = [r.reason or "" for r in waits]
            assert all(reason.startswith("quota") for reason in reasons), runs
            for reason in reasons:
                held_back[reason] = held_back.get(reason, 0) + 1
            assert [r.outcome for r in runs if r.outcome != "deferred"] == ["succeeded"]
        # The test means something: the connection made claims wait past their slots.
        assert held_back.get("quota_slot_expired", 0) >= COMMANDS - 1, held_back
