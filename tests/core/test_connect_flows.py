"""The Runtime's connect flows, row by row: every flow from every state, with refusals."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.connect_flows import (
    FLOWS,
    OPERATOR_FLOWS,
    Flow,
    GrantAction,
    plan_flow,
    plan_operator_flow,
)
from daemon.core.principals import (
    BindingFacts,
    BindingIdentity,
    BindingRefused,
    BindingState,
    PrincipalKind,
    connect,
)

ID = BindingIdentity(issuer="https://auth.example", remote_account_id="portal-1",
                     remote_subject="app-7", installation_id="inst-1",
                     scopes=("write", "read"))
ON = connect(binding_id="b1", kind=PrincipalKind.SHARED, org_id="org-1",
             app_installation_id="install-1", provider="p", identity=ID)
OFF = attrs.evolve(ON, state=BindingState.DISCONNECTED)
ISSUER = attrs.evolve(ID, issuer="https://other.example")
SUBJECT = attrs.evolve(ID, remote_subject="app-8")
ACCOUNT = attrs.evolve(ID, remote_account_id="portal-2")
INSTALL = attrs.evolve(ID, installation_id="inst-2")
NARROW = attrs.evolve(ID, scopes=("read",))
WIDE = attrs.evolve(ID, scopes=("read", "write", "admin"))
SWAP = attrs.evolve(ID, scopes=("read", "admin"))

_ = GrantAction
ROWS: list[tuple[str, BindingFacts | None, Flow, BindingIdentity | None, bool,
                 int | str, GrantAction | None]] = [
    # (name, from, flow, identity after, grant handed over, generation or refusal, grant)
    ("disconnect", ON, Flow.DISCONNECT, None, False, 1, _.REVOKE),
    ("disconnect again", OFF, Flow.DISCONNECT, None, False, 1, _.NONE),
    ("disconnect with a grant", ON, Flow.DISCONNECT, None, True, "grant_not_allowed", None),
    ("disconnect that changes identity", ON, Flow.DISCONNECT, ISSUER, False,
     "field_not_allowed", None),
    ("reconnect", OFF, Flow.RECONNECT, None, True, 2, _.INSTALL),
    ("reconnect while connected: re-authorized", ON, Flow.RECONNECT, None, True, 2,
     _.INSTALL),
    ("reconnect as another account", OFF, Flow.RECONNECT, ACCOUNT, True, 2, _.INSTALL),
    ("reconnect without a grant", OFF, Flow.RECONNECT, None, False, "grant_required", None),
    ("issuer change", ON, Flow.CHANGE_ISSUER, ISSUER, True, 2, _.INSTALL),
    ("remote subject change", ON, Flow.CHANGE_ISSUER, SUBJECT, True, 2, _.INSTALL),
    ("issuer change, nothing different", ON, Flow.CHANGE_ISSUER, ID, False, 1, _.NONE),
    ("issuer change without a grant", ON, Flow.CHANGE_ISSUER, ISSUER, False,
     "grant_required", None),
    ("issuer change that rebinds", ON, Flow.CHANGE_ISSUER, ACCOUNT, True,
     "field_not_allowed", None),
    ("issuer change while disconnected", OFF, Flow.CHANGE_ISSUER, ISSUER, True,
     "binding_disconnected", None),
    ("reinstall with a new installation id", ON, Flow.REINSTALL, INSTALL, True, 2,
     _.INSTALL),
    ("uninstall and reinstall, same id", ON, Flow.REINSTALL, None, True, 2, _.INSTALL),
    ("reinstall while disconnected", OFF, Flow.REINSTALL, INSTALL, True, 2, _.INSTALL),
    ("reinstall without a grant", ON, Flow.REINSTALL, INSTALL, False, "grant_required",
     None),
    ("reinstall that changes scopes", ON, Flow.REINSTALL, WIDE, True, "field_not_allowed",
     None),
    ("rebind to another account", ON, Flow.REBIND, ACCOUNT, True, 2, _.INSTALL),
    ("rebind to another subject", ON, Flow.REBIND, SUBJECT, True, 2, _.INSTALL),
    ("rebind that changes the issuer", ON, Flow.REBIND, ISSUER, True, "field_not_allowed",
     None),
    ("rebind while disconnected", OFF, Flow.REBIND, ACCOUNT, True, "binding_disconnected",
     None),
    ("scopes widened", ON, Flow.CHANGE_SCOPES, WIDE, True, 2, _.INSTALL),
    ("scopes replaced", ON, Flow.CHANGE_SCOPES, SWAP, True, 2, _.INSTALL),
    ("scopes widened without a grant", ON, Flow.CHANGE_SCOPES, WIDE, False,
     "grant_required", None),
    ("scopes narrowed: same generation", ON, Flow.CHANGE_SCOPES, NARROW, False, 1, _.NONE),
    ("scopes narrowed with a narrower token", ON, Flow.CHANGE_SCOPES, NARROW, True, 1,
     _.REPLACE),
    ("scopes change that reinstalls", ON, Flow.CHANGE_SCOPES, INSTALL, True,
     "field_not_allowed", None),
    ("connect an existing binding", ON, Flow.CONNECT, None, True, "binding_exists", None),
]


@pytest.mark.parametrize(("name", "start", "flow", "identity", "grant", "expect", "action"),
                         ROWS, ids=[r[0] for r in ROWS])
def test_flow_table(name: str, start: BindingFacts | None, flow: Flow,
                    identity: BindingIdentity | None, grant: bool, expect: int | str,
                    action: GrantAction | None) -> None:
    expected = start.generation if start is not None else None
    if isinstance(expect, str):
        with pytest.raises(BindingRefused) as info:
            plan_flow(start, flow, binding_id="b1", expected_generation=expected,
                      has_grant=grant, identity=identity)
        assert info.value.reason == expect
        return
    plan = plan_flow(start, flow, binding_id="b1", expected_generation=expected,
                     has_grant=grant, identity=identity)
    assert (plan.after.generation, plan.grant) == (expect, action)
    assert plan.bumped == (expect != (start.generation if start else 0))
    assert plan.after.identity == (identity or ID)
    want = BindingState.DISCONNECTED if flow is Flow.DISCONNECT else BindingState.CONNECTED
    assert plan.after.state is want


@pytest.mark.parametrize("flow", [f for f in Flow if f is not Flow.CONNECT])
def test_every_flow_but_connect_is_a_cas_on_the_generation(flow: Flow) -> None:
    for start in (ON, OFF):
        with pytest.raises(BindingRefused) as info:
            plan_flow(start, flow, binding_id="b1", expected_generation=start.generation + 1,
                      has_grant=True, identity=None)
        assert info.value.reason == "stale_generation"


@pytest.mark.parametrize("flow", [f for f in Flow if f is not Flow.CONNECT])
def test_every_flow_but_connect_needs_the_binding(flow: Flow) -> None:
    with pytest.raises(BindingRefused) as info:
        plan_flow(None, flow, binding_id="b1", expected_generation=1, has_grant=True)
    assert info.value.reason == "unknown_binding"


def test_connect_starts_at_generation_one_with_a_grant() -> None:
    plan = plan_flow(None, Flow.CONNECT, binding_id="b1", expected_generation=None,
                     has_grant=True, new=ON)
    assert (plan.after, plan.bumped, plan.grant) == (ON, True, GrantAction.INSTALL)
    with pytest.raises(BindingRefused) as info:
        plan_flow(None, Flow.CONNECT, binding_id="b1", expected_generation=None,
                  has_grant=False, new=ON)
    assert info.value.reason == "grant_required"


def test_the_table_covers_every_flow() -> None:
    assert set(FLOWS) == set(Flow)


OPERATOR_ROWS: list[tuple[str, BindingFacts, Flow, BindingIdentity | None, int | str,
                          BindingState | None]] = [
    # (name, from, flow, identity after, generation or refusal, state after)
    ("issuer change: no grant needed", ON, Flow.CHANGE_ISSUER, ISSUER, 2, BindingState.CONNECTED),
    ("subject change", ON, Flow.CHANGE_ISSUER, SUBJECT, 2, BindingState.CONNECTED),
    ("issuer change, nothing different", ON, Flow.CHANGE_ISSUER, ID, 1,
     BindingState.CONNECTED),
    ("issuer change that rebinds", ON, Flow.CHANGE_ISSUER, ACCOUNT, "field_not_allowed", None),
    ("issuer emptied", ON, Flow.CHANGE_ISSUER, attrs.evolve(ID, issuer=""), "missing_field",
     None),
    ("issuer change while disconnected", OFF, Flow.CHANGE_ISSUER, ISSUER,
     "binding_disconnected", None),
    ("reinstall, new id", ON, Flow.REINSTALL, INSTALL, 2, BindingState.CONNECTED),
    ("reinstall, same id", ON, Flow.REINSTALL, None, 2, BindingState.CONNECTED),
    ("reinstall while disconnected connects", OFF, Flow.REINSTALL, INSTALL, 2,
     BindingState.CONNECTED),
    ("reinstall that changes scopes", ON, Flow.REINSTALL, WIDE, "field_not_allowed", None),
    ("rebind to another account", ON, Flow.REBIND, ACCOUNT, 2, BindingState.CONNECTED),
    ("rebind to an empty account", ON, Flow.REBIND,
     attrs.evolve(ID, remote_account_id=""), "missing_field", None),
    ("rebind that changes the issuer", ON, Flow.REBIND, ISSUER, "field_not_allowed", None),
    ("scopes widened", ON, Flow.CHANGE_SCOPES, WIDE, 2, BindingState.CONNECTED),
    ("scopes replaced", ON, Flow.CHANGE_SCOPES, SWAP, 2, BindingState.CONNECTED),
    ("scopes narrowed: same generation", ON, Flow.CHANGE_SCOPES, NARROW, 1,
     BindingState.CONNECTED),
    ("scopes change that reinstalls", ON, Flow.CHANGE_SCOPES, INSTALL, "field_not_allowed",
     None),
    ("disconnect is not an identity flow", ON, Flow.DISCONNECT, None, "flow_not_allowed",
     None),
    ("reconnect is not an identity flow", OFF, Flow.RECONNECT, None, "flow_not_allowed", None),
    ("connect is not an identity flow", ON, Flow.CONNECT, None, "flow_not_allowed", None),
]


@pytest.mark.parametrize(("name", "start", "flow", "identity", "expect", "state"),
                         OPERATOR_ROWS, ids=[r[0] for r in OPERATOR_ROWS])
def test_operator_flows_follow_the_same_rows_without_a_grant(
        name: str, start: BindingFacts, flow: Flow, identity: BindingIdentity | None,
        expect: int | str, state: BindingState | None) -> None:
    if isinstance(expect, str):
        with pytest.raises(BindingRefused) as info:
            plan_operator_flow(start, flow, binding_id="b1",
                               expected_generation=start.generation, identity=identity)
        assert info.value.reason == expect
        return
    plan = plan_operator_flow(start, flow, binding_id="b1",
                              expected_generation=start.generation, identity=identity)
    assert (plan.after.generation, plan.after.state, plan.grant) == (
        expect, state, GrantAction.NONE)
    assert plan.bumped == (expect != start.generation)
    assert plan.after.identity == (identity or ID)


@pytest.mark.parametrize("flow", OPERATOR_FLOWS)
def test_operator_flows_are_a_cas_and_need_the_binding(flow: Flow) -> None:
    with pytest.raises(BindingRefused) as stale:
        plan_operator_flow(ON, flow, binding_id="b1", expected_generation=2, identity=None)
    assert stale.value.reason == "stale_generation"
    with pytest.raises(BindingRefused) as unknown:
        plan_operator_flow(None, flow, binding_id="b1", expected_generation=1, identity=None)
    assert unknown.value.reason == "unknown_binding"


def test_the_runtime_may_not_empty_an_identity_field_either() -> None:
    with pytest.raises(BindingRefused) as info:
        plan_flow(ON, Flow.REBIND, binding_id="b1", expected_generation=1, has_grant=True,
                  identity=attrs.evolve(ID, remote_subject=""))
    assert info.value.reason == "missing_field"
