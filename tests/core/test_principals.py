"""PrincipalBinding transitions, row by row: every event in every state."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.identity import integration_scope_digest
from daemon.core.principals import (
    BindingEvent,
    BindingFacts,
    BindingIdentity,
    BindingRefused,
    BindingState,
    Drift,
    PrincipalKind,
    config_drift,
    connect,
    dispatchable,
    scope_digest,
    transition,
)

ID = BindingIdentity(issuer="https://auth.example", remote_account_id="portal-1",
                     remote_subject="app-7", installation_id="inst-1",
                     scopes=("write", "read"))
BASE = connect(binding_id="b1", kind=PrincipalKind.SHARED, org_id="org-1",
               app_installation_id="install-1", provider="p", identity=ID)
OFF = attrs.evolve(BASE, state=BindingState.DISCONNECTED)

CHANGES = {
    "issuer": attrs.evolve(ID, issuer="https://other.example"),
    "remote subject": attrs.evolve(ID, remote_subject="app-8"),
    "remote account": attrs.evolve(ID, remote_account_id="portal-2"),
    "installation id": attrs.evolve(ID, installation_id="inst-2"),
    "scope added": attrs.evolve(ID, scopes=("read", "write", "admin")),
    "scope replaced": attrs.evolve(ID, scopes=("read", "admin")),
}


def test_connect_starts_at_generation_one() -> None:
    assert (BASE.generation, BASE.state) == (1, BindingState.CONNECTED)
    assert BASE.identity.scopes == ("read", "write")  # order never matters


@pytest.mark.parametrize("what", sorted(CHANGES))
def test_every_change_that_could_retarget_work_bumps_the_generation(what: str) -> None:
    after = transition(BASE, BindingEvent.CHANGE, CHANGES[what])
    assert (after.generation, after.identity) == (2, CHANGES[what])


ROWS: list[tuple[str, BindingFacts, BindingEvent, BindingIdentity | None, int | str,
                 BindingState | None]] = [
    # (name, from, event, identity, generation after or refusal reason, state after)
    ("disconnect", BASE, BindingEvent.DISCONNECT, None, 1, BindingState.DISCONNECTED),
    ("disconnect again", OFF, BindingEvent.DISCONNECT, None, 1, BindingState.DISCONNECTED),
    ("reconnect", OFF, BindingEvent.RECONNECT, None, 2, BindingState.CONNECTED),
    ("reconnect as another", OFF, BindingEvent.RECONNECT, CHANGES["remote account"], 2,
     BindingState.CONNECTED),
    ("same identity", BASE, BindingEvent.CHANGE, attrs.evolve(ID, scopes=("read", "write")),
     1, BindingState.CONNECTED),
    # A strict subset cannot reach more than the pinned authority (RFC 6749 3.3, 6).
    ("scope removed", BASE, BindingEvent.CHANGE, attrs.evolve(ID, scopes=("read",)), 1,
     BindingState.CONNECTED),
    ("reconnect while connected", BASE, BindingEvent.RECONNECT, None, "not_disconnected",
     None),
    ("change while disconnected", OFF, BindingEvent.CHANGE, ID, "disconnected", None),
    ("change without identity", BASE, BindingEvent.CHANGE, None, "missing_field", None),
    ("connect twice", BASE, BindingEvent.CONNECT, None, "already_connected", None),
    ("connect after disconnect", OFF, BindingEvent.CONNECT, None, "use_reconnect", None),
]


@pytest.mark.parametrize(("name", "start", "event", "identity", "expect", "state"), ROWS,
                         ids=[r[0] for r in ROWS])
def test_transition_table(name: str, start: BindingFacts, event: BindingEvent,
                          identity: BindingIdentity | None, expect: int | str,
                          state: BindingState | None) -> None:
    if isinstance(expect, str):
        with pytest.raises(BindingRefused) as info:
            transition(start, event, identity)
        assert info.value.reason == expect
        return
    after = transition(start, event, identity)
    assert (after.generation, after.state) == (expect, state)


def test_every_event_in_every_state_is_decided() -> None:
    """Exhaustive: each (state, event) pair either moves or is refused with a reason
    (an unhandled pair would raise AssertionError)."""
    decided: dict[tuple[BindingState, BindingEvent], str] = {}
    for start in (BASE, OFF):
        for event in BindingEvent:
            try:
                decided[(start.state, event)] = transition(start, event, ID).state.value
            except BindingRefused as exc:
                decided[(start.state, event)] = exc.reason
    assert len(decided) == len(BindingState) * len(BindingEvent)


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"kind": PrincipalKind.PER_USER}, "user_required"),
    ({"user_id": "u1"}, "user_not_allowed"),
    ({"org_id": ""}, "missing_field"),
    ({"identity": attrs.evolve(ID, remote_subject="")}, "missing_field"),
])
def test_connect_refusals(kwargs: dict[str, object], reason: str) -> None:
    args: dict[str, object] = {"binding_id": "b1", "kind": PrincipalKind.SHARED,
                               "org_id": "org-1", "app_installation_id": "i",
                               "provider": "p", "identity": ID, **kwargs}
    with pytest.raises(BindingRefused) as info:
        connect(**args)  # type: ignore[arg-type]
    assert info.value.reason == reason


def test_per_user_principal() -> None:
    mine = connect(binding_id="b2", kind=PrincipalKind.PER_USER, org_id="org-1",
                   app_installation_id="i", provider="p", identity=ID, user_id="u1")
    assert (mine.kind, mine.user_id) == (PrincipalKind.PER_USER, "u1")


@pytest.mark.parametrize(("facts", "pinned", "reason"), [
    (BASE, 1, None),
    (BASE, 2, "binding_generation"),
    (transition(BASE, BindingEvent.CHANGE, CHANGES["issuer"]), 1, "binding_generation"),
    (OFF, 1, "binding_disconnected"),
    (None, 1, "binding_missing"),
])
def test_dispatchable(facts: BindingFacts | None, pinned: int, reason: str | None) -> None:
    assert dispatchable(facts, pinned) == reason


def test_new_work_is_scoped_by_the_durable_account() -> None:
    rebound = transition(BASE, BindingEvent.CHANGE, CHANGES["remote account"])
    assert scope_digest(BASE) == integration_scope_digest("org-1", "install-1", "p",
                                                          "portal-1")
    assert scope_digest(rebound) == integration_scope_digest("org-1", "install-1", "p",
                                                             "portal-2")
    # Nothing but the account (of the scope's coordinates) moves it: not the subject,
    # issuer, installation or scopes, which stay behind the generation.
    for what in ("issuer", "remote subject", "installation id", "scope added"):
        assert scope_digest(transition(BASE, BindingEvent.CHANGE, CHANGES[what])) == (
            scope_digest(BASE)), what


DRIFT_ROWS: list[tuple[str, BindingFacts, BindingFacts, tuple[Drift, ...]]] = [
    # (name, configured (bootstrap facts), durable, drift)
    ("in step", BASE, BASE, ()),
    ("rebound", BASE, transition(BASE, BindingEvent.CHANGE, CHANGES["remote account"]),
     (Drift("generation", "1", "2"), Drift("remote_account_id", "portal-1", "portal-2"))),
    ("reinstalled", BASE, transition(BASE, BindingEvent.CHANGE, CHANGES["installation id"]),
     (Drift("generation", "1", "2"), Drift("installation_id", "inst-1", "inst-2"))),
    ("reconnected only", BASE, transition(OFF, BindingEvent.RECONNECT),
     (Drift("generation", "1", "2"),)),
    # The endpoint (the issuer's bootstrap) is configuration: moving it is no drift.
    ("issuer moved", BASE, transition(BASE, BindingEvent.CHANGE, CHANGES["issuer"]),
     (Drift("generation", "1", "2"),)),
    # A configuration naming no installation says nothing about it.
    ("no configured installation",
     attrs.evolve(BASE, identity=attrs.evolve(ID, installation_id="")), BASE, ()),
    # The TOML edited to the rebound account, generation still the bootstrap one.
    ("file caught up on the account",
     attrs.evolve(BASE, identity=CHANGES["remote account"]),
     transition(BASE, BindingEvent.CHANGE, CHANGES["remote account"]),
     (Drift("generation", "1", "2"),)),
]


@pytest.mark.parametrize(("configured", "durable", "drift"),
                         [r[1:] for r in DRIFT_ROWS], ids=[r[0] for r in DRIFT_ROWS])
def test_config_drift_names_what_the_file_says_differently(
        configured: BindingFacts, durable: BindingFacts, drift: tuple[Drift, ...]) -> None:
    assert config_drift(configured, durable) == drift
