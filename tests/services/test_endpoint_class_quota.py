"""Endpoint classes on the effect path, against the real quota ledger (SQLite, MariaDB).

The shipped HubSpot L1 with a second operation of the ``search`` class (HubSpot's CRM
search endpoints have a limit of their own: 4 requests per second per token) and a test
dimension with a budget per endpoint class. Calls of the search class exhaust the search
budget and their own class's budget; a ``crm_objects`` call still gets its slots at the
same instant, and none of its reservations touches a search key.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest

from config.definitions import OperationDefinition, parse_provider
from config.settings import BindingSettings, QuotaScope
from daemon.core.quota import ReservationState
from daemon.services.effect_quota import QuotaWait, Reserved, quota_keys, reserve
from daemon.services.read_quota import read_keys
from storage.work_store import WorkStore
from tests.support.retention import FixedClock
from tests.support.work import T0, claim, enqueue

UPDATE = "hubspot.contact.update_jobtitle"
SEARCH = "hubspot.contact.search"
BINDING = BindingSettings(binding_id="hubspot-main", provider="hubspot", org_id="org-acme",
                          app_installation_id="install-1", remote_account_id="portal-1",
                          base_url="http://127.0.0.1:9")


def _operations() -> dict[str, OperationDefinition]:
    doc: dict[str, Any] = tomllib.loads(Path("config/providers/hubspot.toml").read_text())
    ops = doc["operations"]
    ops[SEARCH] = copy.deepcopy(ops[UPDATE])
    ops[SEARCH]["endpoint_class"] = "search"
    doc["quota"]["per_class"] = {"limit": 100, "window": 10.0, "burst": 10,
                                 "per_endpoint_class": True}
    return parse_provider(doc, "hubspot.toml")


def test_each_class_counts_against_its_own_keys_and_the_shared_ones() -> None:
    ops = _operations()
    update = {k.key for k in quota_keys(ops[UPDATE], BINDING, clock_spread_us=0)}
    search = {k.key for k in quota_keys(ops[SEARCH], BINDING, clock_spread_us=0)}
    assert update == {"hubspot:per_class:org-acme:install-1:class:crm_objects",
                      "hubspot:per_app_10s:org-acme:install-1",
                      "hubspot:per_app_day:org-acme:install-1"}
    assert search == {"hubspot:search:org-acme:hubspot-main",
                      "hubspot:per_class:org-acme:install-1:class:search",
                      "hubspot:per_app_10s:org-acme:install-1",
                      "hubspot:per_app_day:org-acme:install-1"}


def test_a_provider_read_has_no_endpoint_class() -> None:
    """Hydration and list reads count against the dimensions that count every call:
    never a class's own budget (search), never a per-class split, whichever operation
    of the provider comes first."""
    ops = _operations()
    for first in (SEARCH, UPDATE):
        ordered = [ops[first], *(o for name, o in ops.items() if name != first)]
        keys, _ = read_keys(ordered, BINDING, clock_spread_us=0)
        assert {k.key for k in keys} == {"hubspot:per_class:org-acme:install-1",
                                         "hubspot:per_app_10s:org-acme:install-1",
                                         "hubspot:per_app_day:org-acme:install-1"}, first


async def test_calls_of_one_class_never_consume_another_class_budget(
        store: WorkStore) -> None:
    ops = _operations()
    (work_id,) = await enqueue(store)
    (item,) = (await claim(store)).claimed
    assert item.fence is not None
    clock = FixedClock(T0)
    search_keys = quota_keys(ops[SEARCH], BINDING, clock_spread_us=0)
    # Search calls until the search budget (4 per second; a claim waits up to 1 s) says
    # when to come back.
    granted: list[list[Reserved]] = []
    while True:
        got = await reserve(store, clock, item.fence, search_keys)
        if isinstance(got, QuotaWait):
            break
        granted.append(got)
    assert got.key == "hubspot:search:org-acme:hubspot-main"
    assert len(granted) == 4 and got.until_us > T0
    # At the same instant a crm_objects call still has its slot, on none of the search
    # keys: its own class's key, and the app's limits every class counts against.
    update = await reserve(store, clock, item.fence,
                           quota_keys(ops[UPDATE], BINDING, clock_spread_us=0))
    assert not isinstance(update, QuotaWait)
    assert all(r.slot_us <= T0 + 1_000_000 for r in update)
    assert {r.key.key for r in update} == {
        "hubspot:per_class:org-acme:install-1:class:crm_objects",
        "hubspot:per_app_10s:org-acme:install-1", "hubspot:per_app_day:org-acme:install-1"}
    # Slots granted and not given back (a round that found no common instant returns its).
    rows = {v.quota_key: v.granted_total - v.returned_total
            for v in await store.quota_keys("hubspot:")}
    assert rows["hubspot:search:org-acme:hubspot-main"] == 4  # the search calls' only
    assert rows["hubspot:per_class:org-acme:install-1:class:search"] == 4
    assert rows["hubspot:per_class:org-acme:install-1:class:crm_objects"] == 1
    assert rows["hubspot:per_app_10s:org-acme:install-1"] == 5  # the app's: both classes
    # Bound to the claim as each was granted; those given back were released with it.
    reservations = await store.quota_reservations(work_id)
    by_key: dict[str, int] = {}
    for r in reservations:
        if r.state is ReservationState.RESERVED:
            by_key[r.quota_key] = by_key.get(r.quota_key, 0) + 1
    assert by_key["hubspot:search:org-acme:hubspot-main"] == 4


@pytest.mark.parametrize("endpoint_class", ["crm_objects", "search"])
def test_an_l2_override_gives_only_the_classes_it_names_their_own_budget(
        endpoint_class: str) -> None:
    ops = _operations()
    binding = attrs.evolve(BINDING, quota=(QuotaScope(dimension="per_app_10s", scope="",
                                                      endpoint_classes=("search",)),))
    op = ops[UPDATE] if endpoint_class == "crm_objects" else ops[SEARCH]
    keys = {k.key for k in quota_keys(op, binding, clock_spread_us=0) if ":per_app_10s:" in k.key}
    expected = ("hubspot:per_app_10s:org-acme:install-1:class:search"
                if endpoint_class == "search" else "hubspot:per_app_10s:org-acme:install-1")
    assert keys == {expected}
