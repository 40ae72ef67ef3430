"""The Runtime's connect flows over a PrincipalBinding, as data (seed 8.1).

Theory of operation
-------------------
The CRM Runtime runs the user-facing half of connecting an account (the OAuth
authorization-code exchange, an app installation) and hands the result to integrationd
through ``/v1/``. Each flow is one row of :data:`FLOWS`: the binding states it may start
from, the identity fields it may change, how it moves ``BindingGeneration`` and what it
does with the AuthorizationGrant. :func:`plan_flow` turns (current facts, flow, request)
into a :class:`FlowPlan` or a :class:`~daemon.core.principals.BindingRefused` with a
stable reason; the storage shell applies the plan as one compare-and-swap.

==================  ======================  ===================  ======================
flow                from                    may change           generation
==================  ======================  ===================  ======================
``connect``         (no binding)            everything           1 (new grant)
``disconnect``      connected, disconnected nothing              same (grant revoked)
``reconnect``       connected, disconnected everything           + 1 (new grant)
``change_issuer``   connected               issuer, subject      + 1 if changed
``reinstall``       connected, disconnected installation id      + 1 always
``rebind``          connected               account, subject     + 1 if changed
``change_scopes``   connected               scopes               + 1 unless narrowed
==================  ======================  ===================  ======================

*Reinstall* always moves the generation, even with the same installation id: an app that
was uninstalled and installed again is a new authorization, and work queued under the old
one must not run under the new one. *Reconnect* from ``connected`` is the Runtime running
the authorization again: the old grant is superseded as if disconnected first.

**Narrowing scopes does not move the generation** (:func:`daemon.core.principals.
authority_moves`). OAuth scopes are a set of independent grants (RFC 6749 3.3), and a
refresh may itself narrow them within one grant (RFC 6749 6): a strict subset cannot reach
another remote identity nor do anything the pinned authority could not, so queued work
cannot be retargeted; at worst the provider refuses it (a definitive 403). A narrowing
with a new token is a new ``TokenVersion`` of the same generation. Adding any scope, or
replacing one with another, moves the generation: work admitted under the smaller
authority must not run under the larger one.

Every flow but ``connect`` names the generation the Runtime saw (a CAS): a mismatch is
``stale_generation`` and nothing is written. A flow may not empty the issuer, remote
account or remote subject (``missing_field``).

**Operators** (the console, :func:`plan_operator_flow`) run the four identity flows
(``change_issuer``, ``reinstall``, ``rebind``, ``change_scopes``) by the same rows, on
the generation they saw, but hand over no grant: a flow that moves the generation leaves
the new generation without one (``GrantAction.NONE``; its work fails closed with
``no_grant``) until the Runtime hands one over or an S2S installation mints it; one that
keeps it (a narrowing, nothing different) keeps the grant as it is.
"""

from __future__ import annotations

import enum

import attrs

from daemon.core.principals import (
    BindingFacts,
    BindingIdentity,
    BindingRefused,
    BindingState,
    authority_moves,
)


class Flow(enum.StrEnum):
    CONNECT = "connect"
    DISCONNECT = "disconnect"
    RECONNECT = "reconnect"
    CHANGE_ISSUER = "change_issuer"
    REINSTALL = "reinstall"
    REBIND = "rebind"
    CHANGE_SCOPES = "change_scopes"


class GenerationRule(enum.StrEnum):
    FIRST = "first"              # a new binding: generation 1
    KEEP = "keep"                # never moves
    BUMP = "bump"                # always moves
    IF_AUTHORITY = "if_authority"  # moves when authority_moves(before, after)


class GrantAction(enum.StrEnum):
    INSTALL = "install"    # the first grant of a (new) generation: token version 1
    REPLACE = "replace"    # the next token version of the current generation
    REVOKE = "revoke"      # the current generation's grant stops being usable
    NONE = "none"


_ALL = frozenset({"issuer", "remote_account_id", "remote_subject", "installation_id",
                  "scopes"})
_ANY_STATE = frozenset({BindingState.CONNECTED, BindingState.DISCONNECTED})
_CONNECTED = frozenset({BindingState.CONNECTED})


@attrs.frozen
class FlowRule:
    from_states: frozenset[BindingState]  # empty: only when no binding exists
    fields: frozenset[str]                 # identity fields the flow may change
    generation: GenerationRule


FLOWS: dict[Flow, FlowRule] = {
    Flow.CONNECT: FlowRule(frozenset(), _ALL, GenerationRule.FIRST),
    Flow.DISCONNECT: FlowRule(_ANY_STATE, frozenset(), GenerationRule.KEEP),
    Flow.RECONNECT: FlowRule(_ANY_STATE, _ALL, GenerationRule.BUMP),
    Flow.CHANGE_ISSUER: FlowRule(_CONNECTED, frozenset({"issuer", "remote_subject"}),
                                 GenerationRule.IF_AUTHORITY),
    Flow.REINSTALL: FlowRule(_ANY_STATE, frozenset({"installation_id"}), GenerationRule.BUMP),
    Flow.REBIND: FlowRule(_CONNECTED, frozenset({"remote_account_id", "remote_subject"}),
                          GenerationRule.IF_AUTHORITY),
    Flow.CHANGE_SCOPES: FlowRule(_CONNECTED, frozenset({"scopes"}),
                                 GenerationRule.IF_AUTHORITY),
}


@attrs.frozen
class FlowPlan:
    before: BindingFacts | None
    after: BindingFacts
    bumped: bool
    grant: GrantAction


# The flows an operator runs from the console (disconnect and reconnect are
# daemon.core.principals.transition, as the CLI runs them).
OPERATOR_FLOWS = (Flow.CHANGE_ISSUER, Flow.REINSTALL, Flow.REBIND, Flow.CHANGE_SCOPES)
_REQUIRED = frozenset({"issuer", "remote_account_id", "remote_subject"})


def _changed_fields(before: BindingIdentity, after: BindingIdentity) -> set[str]:
    return {name for name in _ALL if getattr(before, name) != getattr(after, name)}


def plan_flow(current: BindingFacts | None, flow: Flow, *, binding_id: str,
              expected_generation: int | None, has_grant: bool,
              identity: BindingIdentity | None = None,
              new: BindingFacts | None = None, operator: bool = False) -> FlowPlan:
    """What ``flow`` does to ``current``.

    ``new`` is the binding a ``connect`` creates (from
    :func:`daemon.core.principals.connect`); ``identity`` the complete identity after any
    other flow (None: unchanged); ``has_grant`` whether the Runtime handed over a grant;
    ``operator``: an operator's flow, which moves the generation without one.
    """
    rule = FLOWS[flow]
    if flow is Flow.CONNECT:
        if current is not None:
            raise BindingRefused("binding_exists", f"binding {binding_id} already exists:"
                                 " reconnect it")
        if new is None:
            raise BindingRefused("missing_field", "a connect names the new binding")
        if not has_grant:
            raise BindingRefused("grant_required", "a connect hands over its grant")
        return FlowPlan(None, new, True, GrantAction.INSTALL)
    if current is None:
        raise BindingRefused("unknown_binding", f"no binding {binding_id} in this scope")
    if expected_generation != current.generation:
        raise BindingRefused("stale_generation", f"binding {binding_id} is at generation"
                             f" {current.generation}, not {expected_generation}")
    if current.state not in rule.from_states:
        raise BindingRefused("binding_disconnected", f"binding {binding_id} is"
                             f" {current.state.value}: {flow.value} needs it connected")
    after_identity = identity if identity is not None else current.identity
    changed = _changed_fields(current.identity, after_identity)
    outside = changed - rule.fields
    if outside:
        raise BindingRefused("field_not_allowed", f"{flow.value} may not change"
                             f" {', '.join(sorted(outside))}")
    emptied = sorted(n for n in changed & _REQUIRED if not getattr(after_identity, n))
    if emptied:
        raise BindingRefused("missing_field", f"{', '.join(emptied)} must not be empty")
    if rule.generation is GenerationRule.KEEP:
        if has_grant:
            raise BindingRefused("grant_not_allowed", f"{flow.value} takes no grant")
        after = attrs.evolve(current, state=BindingState.DISCONNECTED)
        return FlowPlan(current, after, False, GrantAction.REVOKE
                        if current.state is BindingState.CONNECTED else GrantAction.NONE)
    bump = (rule.generation is GenerationRule.BUMP
            or authority_moves(current.identity, after_identity))
    after = attrs.evolve(current, identity=after_identity, state=BindingState.CONNECTED,
                         generation=current.generation + (1 if bump else 0))
    if bump:
        if not has_grant:
            if operator:
                return FlowPlan(current, after, True, GrantAction.NONE)
            raise BindingRefused("grant_required", f"{flow.value} moves the generation:"
                                 " hand over the grant of the new authority")
        return FlowPlan(current, after, True, GrantAction.INSTALL)
    return FlowPlan(current, after, False, GrantAction.REPLACE if has_grant
                    else GrantAction.NONE)


def plan_operator_flow(current: BindingFacts | None, flow: Flow, *, binding_id: str,
                       expected_generation: int,
                       identity: BindingIdentity | None) -> FlowPlan:
    """An operator's identity flow (the same row as the Runtime's, without a grant)."""
    if flow not in OPERATOR_FLOWS:
        raise BindingRefused("flow_not_allowed", f"an operator runs"
                             f" {', '.join(f.value for f in OPERATOR_FLOWS)} here, not"
                             f" {flow.value}")
    return plan_flow(current, flow, binding_id=binding_id,
                     expected_generation=expected_generation, has_grant=False,
                     identity=identity, operator=True)
