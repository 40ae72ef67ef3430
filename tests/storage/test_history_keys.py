"""Conformance: the executions' rollup (storage/history.py, migration 0048) counts an
effect item under its command's org, binding and provider operation, in the journaling
transaction, on every backend; every other family's item under none; the reads and the
executions behind a point narrow by them; a rebuild from the journal joined to the items
and commands gives the same rows (issue 23 item 1: throughput and DLQ inflow per org,
binding and operation).

Before migration 0048 the rollup's key was (family, outcome) only: a binding filter had
nothing to narrow (``history_outcomes`` took no filter, and the page said "Not narrowed by
org, binding or operation")."""

from __future__ import annotations

import attrs
import pytest

from storage.history import (
    BUCKET_US,
    EFFECT_FAMILY,
    EXECUTION_LEVELS_US,
    HOUR_US,
    ExecutionFilter,
    HistoryPoint,
    bucket_of,
)
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, backend_params
from tests.support.history import finish_effects, rollup_rows
from tests.support.work import T0

M0 = bucket_of(T0)


async def test_effect_items_are_counted_per_org_binding_and_operation(
        database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    ids = await finish_effects(a, T0)
    minute = {k[1:]: n for k, n in (await rollup_rows(b)).items() if k[0] == BUCKET_US}
    deal, title = "hubspot.deal.create", "hubspot.contact.update_jobtitle"
    assert minute == {
        (M0, EFFECT_FAMILY, "succeeded", "org-1", "hubspot-main", title): 1,
        (M0, EFFECT_FAMILY, "succeeded", "org-1", "hubspot-main", deal): 1,
        (M0, EFFECT_FAMILY, "dead", "org-1", "hubspot-eu", title): 1,
        (M0, EFFECT_FAMILY, "dead", "org-2", "hubspot-eu", deal): 1,
        (M0, EFFECT_FAMILY, "succeeded", "org-2", "hubspot-eu", deal): 1,
        (M0, "noop", "succeeded", "", "", ""): 1,
    }
    # Every level holds the same keys.
    levels = {k[0] for k in await rollup_rows(b)}
    assert levels == set(EXECUTION_LEVELS_US)

    async def outcomes(where: ExecutionFilter, family: str | None = None,
                       step: int = BUCKET_US) -> dict[str, int]:
        points = await b.history_outcomes(M0, M0 + step, step, family, where=where)
        assert all(isinstance(p, HistoryPoint) for p in points)
        return {f"{p.family}/{p.outcome}": p.executions for p in points}

    effect = EFFECT_FAMILY
    assert await outcomes(ExecutionFilter()) == {f"{effect}/succeeded": 3,
                                                 f"{effect}/dead": 2, "noop/succeeded": 1}
    # Filters keep the effect items of that org, binding or operation (no noop item).
    rows = [
        (ExecutionFilter(binding="hubspot-eu"), {f"{effect}/dead": 2, f"{effect}/succeeded": 1}),
        (ExecutionFilter(binding="hubspot-main"), {f"{effect}/succeeded": 2}),
        (ExecutionFilter(org="org-2"), {f"{effect}/dead": 1, f"{effect}/succeeded": 1}),
        (ExecutionFilter(operation=title), {f"{effect}/dead": 1, f"{effect}/succeeded": 1}),
        (ExecutionFilter(org="org-1", binding="hubspot-eu"), {f"{effect}/dead": 1}),
        (ExecutionFilter(org="org-2", binding="hubspot-main"), {}),
        (ExecutionFilter(binding="nobody"), {}),
    ]
    for where, expected in rows:
        assert await outcomes(where) == expected, where
        # A step of hours reads the hour rows: the same counts.
        assert await outcomes(where, step=HOUR_US) == expected, where
    assert await outcomes(ExecutionFilter(org="org-1"), family="noop") == {}
    # The executions behind a point: the same narrowing, joined to item and command.
    behind = await b.history_executions(M0, M0 + BUCKET_US, family=None, outcome="dead",
                                        limit=10, where=ExecutionFilter(binding="hubspot-eu"))
    assert sorted(e.work_id for e in behind) == sorted([ids["lead-c"], ids["lead-d"]])
    behind = await b.history_executions(M0, M0 + BUCKET_US, family=None, outcome=None,
                                        limit=10, where=ExecutionFilter(org="org-2",
                                                                        operation=deal))
    assert sorted(e.work_id for e in behind) == sorted([ids["lead-d"], ids["lead-e"]])
    assert await b.history_executions(M0, M0 + BUCKET_US, family="noop", outcome=None,
                                      limit=10, where=ExecutionFilter(org="org-1")) == []
    unfiltered = await b.history_executions(M0, M0 + BUCKET_US, family=None, outcome=None,
                                            limit=10)
    assert len(unfiltered) == 6


# The rebuild's SQL is the same on MariaDB and Galera: one server of each dialect (CI time).
@pytest.mark.parametrize("backend", backend_params(["sqlite", "mysql"]))
async def test_a_keyed_rebuild_equals_the_maintained_rollup(database: FreshDatabase) -> None:
    a, b = await database.open_store(), await database.open_store()
    await finish_effects(a, T0)
    maintained = await rollup_rows(a)

    async def damage(tx: SqlTx) -> None:
        # A lost binding and a wrong count.
        await tx.execute("UPDATE history_rollup SET binding_id = '',"
                         " executions = executions + 5 WHERE binding_id = 'hubspot-main'")

    await a.db.transact(damage, name="test.damage", write=True)
    assert await rollup_rows(a) != maintained
    assert await b.history_rebuild(T0) > 0
    assert await rollup_rows(a) == maintained


@pytest.mark.parametrize("backend", backend_params(["sqlite", "mysql"]))
async def test_the_narrowed_items_come_in_the_unnarrowed_order(database: FreshDatabase) -> None:
    """The items behind a narrowed point (one family, so its ORDER BY leaves the family
    out: migration 0050's index reads them in order) are the unnarrowed read's rows of
    that key, in the same order, ties on the finishing time included (work id, newest
    first)."""
    store = await database.open_store()
    await finish_effects(store, T0)
    await finish_effects_at_once(store)
    everything = await store.history_executions(M0, M0 + 2 * BUCKET_US, family=None,
                                                outcome=None, limit=100)
    assert len({e.finished_at_us for e in everything}) < len(everything)  # ties
    keyed = await store.history_executions(M0, M0 + 2 * BUCKET_US, family=EFFECT_FAMILY,
                                           outcome=None, limit=100)
    assert keyed == [e for e in everything if e.family == EFFECT_FAMILY]
    for where in (ExecutionFilter(binding="hubspot-eu"), ExecutionFilter(org="org-1")):
        narrowed = await store.history_executions(M0, M0 + 2 * BUCKET_US, family=None,
                                                  outcome=None, limit=100, where=where)
        assert narrowed and [e.work_id for e in narrowed] == [
            e.work_id for e in keyed if e.work_id in {n.work_id for n in narrowed}]
        assert (await store.history_executions(M0, M0 + 2 * BUCKET_US, family=None,
                                               outcome=None, limit=2, where=where)
                == narrowed[:2])


async def finish_effects_at_once(store: WorkStore) -> None:
    """Three effect items finished in one batch (one finishing time) a minute later."""
    from daemon.core.outcomes import Succeeded
    from tests.support.commands import accept_pinned, draft
    from tests.support.work import claim, finalization

    now = M0 + BUCKET_US + 5_000_000
    for i, binding in enumerate(("hubspot-eu", "hubspot-main", "hubspot-eu")):
        d = attrs.evolve(draft(f"int-tie-{i}", lead=f"tie-{i}", outbox=f"o-tie-{i}"),
                         binding_id=binding)
        assert (await accept_pinned(store, d, now)).command_id is not None
    items = (await claim(store, family=EFFECT_FAMILY, now=now, limit=3)).claimed
    assert len(items) == 3
    results = await store.work_finalize_if_owner(
        [finalization(i, Succeeded(), now) for i in items], "A", lambda: now)
    assert all(r.applied for r in results)
