"""The inbound Flow's decisions, table-driven, negative rows included."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.core.inbound_change import InboundChange
from daemon.core.inbound_flow import (
    AMBIGUOUS_IDENTITY,
    BAD_VALUE,
    BINDING_DRIFT,
    CONFLICTING_LOCATOR,
    NO_LOCAL_MATCH,
    NO_REMOTE_TIME,
    SEVERAL_LOCAL_MATCHES,
    Adopt,
    Apply,
    FailClosed,
    FlowView,
    Hydrate,
    LinkFacts,
    Lookup,
    Nothing,
    Retire,
    Snapshot,
    decide,
    lost_webhook,
    mutation_key,
    remote_time_ns,
)

T1 = "2030-01-01T00:00:01.000Z"
T2 = "2030-01-01T00:00:02.000Z"
LINK = LinkFacts(link_key="lk1", local_id="lead-1", generation=1, remote_id="7")
INBOUND = {"firstName": "FirstName", "lastName": "LastName", "company": "Company"}


def change(kind: str = "updated", attributes: dict[str, Any] | None = None,
           updated_at: str | None = T2, origin: str = "webhook") -> InboundChange:
    return InboundChange(provider="outreach", binding="outreach-main",
                         resource_type="prospect", resource_id="7", kind=kind,
                         attributes=attributes if attributes is not None else {
                             "firstName": "Ada"},
                         remote_updated_at=updated_at, origin=origin, origin_id="e1")


def view(**overrides: Any) -> FlowView:
    base: dict[str, Any] = {"change": change(), "inbound": INBOUND,
                            "match": ("emails", "Email"), "link": LINK}
    return FlowView(**(base | overrides))


def ns(text: str) -> int:
    value = remote_time_ns(text)
    assert value is not None
    return value


ROWS: list[tuple[str, FlowView, Any]] = [
    ("partial update applies only what it carries",
     view(change=change(attributes={"firstName": "Ada", "title": "CTO"})),
     Apply("lead-1", {"FirstName": "Ada"}, {"firstName": ns(T2)},
           mutation_key("lk1", {"FirstName": "Ada"}, T2), ns(T2))),
    ("a null is a real change, carried", view(change=change(attributes={"company": None})),
     Apply("lead-1", {"Company": None}, {"company": ns(T2)},
           mutation_key("lk1", {"Company": None}, T2), ns(T2))),
    ("outbound-owned field only: nothing", view(change=change(attributes={"title": "CTO"})),
     Nothing("no inbound-owned field is newer than what was applied")),
    ("older than an applied field: never regress",
     view(change=change(updated_at=T1), stamps={"firstName": ns(T2)}),
     Nothing("no inbound-owned field is newer than what was applied")),
    ("equal to an applied field: already applied",
     view(stamps={"firstName": ns(T2)}),
     Nothing("no inbound-owned field is newer than what was applied")),
    ("older for one field, newer for another",
     view(change=change(attributes={"firstName": "A", "lastName": "B"}),
          stamps={"firstName": ns("2030-01-01T00:00:03Z"), "lastName": ns(T1)}),
     Apply("lead-1", {"LastName": "B"}, {"lastName": ns(T2)},
           mutation_key("lk1", {"LastName": "B"}, T2), ns(T2))),
    ("updatedAt in the attributes is enough",
     view(change=change(attributes={"firstName": "A", "updatedAt": T2}, updated_at=None)),
     Apply("lead-1", {"FirstName": "A"}, {"firstName": ns(T2)},
           mutation_key("lk1", {"FirstName": "A"}, T2), ns(T2))),
    ("no remote time: hydrate", view(change=change(updated_at=None)), Hydrate()),
    ("no remote time after hydration: fail closed",
     view(change=change(updated_at=None), snapshot=Snapshot(remote_id="7")),
     FailClosed(NO_REMOTE_TIME, "neither the change nor the record carries updatedAt")),
    ("garbage remote time", view(change=change(updated_at="yesterday")),
     FailClosed(NO_REMOTE_TIME, "the remote time 'yesterday' is not an ISO 8601 time")),
    ("destroyed retires the link", view(change=change(kind="destroyed", attributes={})),
     Retire(LINK, ns(T2))),
    ("destroyed with no link: recorded, nothing to retire",
     view(change=change(kind="destroyed", attributes={}), link=None),
     Nothing("the remote record was destroyed; no link to retire", deleted_ns=ns(T2))),
    ("hydration finds it gone: like destroyed",
     view(change=change(updated_at=None), snapshot=Snapshot(absent=True)),
     Retire(LINK, None)),
    ("older than the observed deletion", view(deleted_ns=ns(T2)),
     Nothing("older than the observed deletion of the record")),
    ("binding drift", view(drift="binding outreach-main is not in the pinned Catalog"),
     FailClosed(BINDING_DRIFT, "binding outreach-main is not in the pinned Catalog")),
    ("hydrated record names another id",
     view(change=change(updated_at=None), snapshot=Snapshot(remote_id="8", updated_at=T2)),
     FailClosed(CONFLICTING_LOCATOR, "the read of prospect 7 answered for another record")),
    ("link names another remote record", view(link=attrs.evolve(LINK, remote_id="9")),
     FailClosed(CONFLICTING_LOCATOR, "the link names another remote record")),
    ("a list value for a text field", view(change=change(attributes={"firstName": ["A"]})),
     FailClosed(BAD_VALUE, "firstName is not text")),
    # ---- no link: the match rule ----
    ("created, no link, no match field: hydrate",
     view(change=change(kind="created"), link=None), Hydrate()),
    ("created, no link, match field carried: look up",
     view(change=change(kind="created", attributes={"emails": ["b@x", "a@x"]}), link=None),
     Lookup("Email", ("a@x", "b@x"))),
    ("hydrated snapshot supplies the match field",
     view(change=change(kind="created"), link=None,
          snapshot=Snapshot(remote_id="7", attributes={"emails": ["a@x"]}, updated_at=T2)),
     Lookup("Email", ("a@x",))),
    ("no match field even after hydration",
     view(change=change(kind="created"), link=None, snapshot=Snapshot(remote_id="7")),
     FailClosed(AMBIGUOUS_IDENTITY, "prospect 7 has no link and no emails to match by")),
    ("exactly one match adopts",
     view(change=change(attributes={"emails": "a@x"}), link=None, candidates=("lead-4",)),
     Adopt("lead-4")),
    ("no local match",
     view(change=change(attributes={"emails": "a@x"}), link=None, candidates=()),
     FailClosed(NO_LOCAL_MATCH, "no local record has this Email")),
    ("several local matches",
     view(change=change(attributes={"emails": "a@x"}), link=None, candidates=("l1", "l2")),
     FailClosed(SEVERAL_LOCAL_MATCHES, "2 local records have this Email")),
    ("no link and no match rule", view(link=None, match=None),
     FailClosed(AMBIGUOUS_IDENTITY, "prospect 7 has no link and the binding declares no"
                " match rule")),
]


@pytest.mark.parametrize(("name", "flow", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_decide(name: str, flow: FlowView, expected: Any) -> None:
    assert decide(flow) == expected


def test_the_change_wins_over_the_snapshot_for_what_it_carries() -> None:
    flow = view(change=change(kind="created", attributes={"firstName": "New"}),
                snapshot=Snapshot(remote_id="7", updated_at=T2,
                                  attributes={"firstName": "Old", "lastName": "L"}))
    step = decide(flow)
    assert isinstance(step, Apply)
    assert step.fields == {"FirstName": "New", "LastName": "L"}


def test_one_observation_is_one_mutation_key_whatever_its_origin() -> None:
    webhook = decide(view())
    reconcile = decide(view(change=change(kind="observed", origin="reconcile")))
    assert isinstance(webhook, Apply) and isinstance(reconcile, Apply)
    assert webhook.mutation_key == reconcile.mutation_key
    later = decide(view(change=change(updated_at="2030-01-01T00:00:02.001Z")))
    assert isinstance(later, Apply) and later.mutation_key != webhook.mutation_key


@pytest.mark.parametrize(("text", "expected"), [
    ("2030-01-01T00:00:00Z", 1_893_456_000 * 10**9),
    ("2030-01-01T00:00:00.5Z", 1_893_456_000 * 10**9 + 500_000_000),
    ("2030-01-01T00:00:00.000000001Z", 1_893_456_000 * 10**9 + 1),
    ("2030-01-01T01:00:00+01:00", 1_893_456_000 * 10**9),
    ("2030-02-30T00:00:00Z", None),
    ("2030-01-01 00:00:00Z", None),
    ("2030-01-01T00:00:00.0000000001Z", None),
    ("2030-01-01T00:00:00", None),
])
def test_remote_times_keep_their_full_precision(text: str, expected: int | None) -> None:
    assert remote_time_ns(text) == expected


def test_nanoseconds_apart_are_ordered() -> None:
    a = remote_time_ns("2030-01-01T00:00:00.000000001Z")
    b = remote_time_ns("2030-01-01T00:00:00.000000002Z")
    assert a is not None and b is not None and a < b


@pytest.mark.parametrize(("origin", "updated", "seen", "lost"), [
    ("reconcile", 5, 4, True),
    ("reconcile", 5, 5, False),
    ("reconcile", None, 0, False),
    ("webhook", 5, 0, False),
])
def test_lost_webhook(origin: str, updated: int | None, seen: int, lost: bool) -> None:
    assert lost_webhook(origin, updated, seen) is lost


# ---- any input: a step, never an exception; never a field outside the inbound map ----

_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["created", "updated", "destroyed", "observed"]),
       attributes=st.dictionaries(st.sampled_from(["firstName", "lastName", "company",
                                                   "title", "emails", "updatedAt", "x"]),
                                  _json_value, max_size=6),
       updated_at=st.none() | st.text(max_size=30) | st.sampled_from([T1, T2]),
       linked=st.booleans(),
       stamps=st.dictionaries(st.sampled_from(["firstName", "lastName", "company"]),
                              st.integers(min_value=0, max_value=2**62), max_size=3),
       candidates=st.none() | st.lists(st.text(min_size=1, max_size=4), max_size=3))
def test_any_change_gets_a_step_and_only_inbound_fields(
        kind: str, attributes: dict[str, Any], updated_at: str | None, linked: bool,
        stamps: dict[str, int], candidates: list[str] | None) -> None:
    flow = view(change=change(kind=kind, attributes=attributes, updated_at=updated_at),
                link=LINK if linked else None, stamps=stamps,
                candidates=None if candidates is None else tuple(candidates))
    step = decide(flow)
    if isinstance(step, Apply):
        assert set(step.fields) <= set(INBOUND.values())
        assert all(stamps.get(remote, -1) < step.updated_ns for remote in step.stamps)
        assert linked
