"""PrincipalBinding transitions and BindingGeneration, as data (seed 8.1).

Theory of operation
-------------------
A binding names whose authority the provider sees: a *shared* principal (an admin, an app
installation, a named credential: organization-level work) or a *per-user* principal (one
user's grant). Its ``generation`` is what every command pins at acceptance; dispatch,
refresh and read-back fail closed unless the pinned generation is still the current one.

So the generation must change on every transition after which queued work could reach a
different remote identity or authority, and on no other:

======================================  ===========================  ==========
event                                   from                         generation
======================================  ===========================  ==========
``connect``                             (none)                       1
``disconnect``                          connected                    same (the
                                                                     state stops
                                                                     dispatch)
``reconnect``                           disconnected                 + 1
``change`` of issuer, remote subject,   connected                    + 1
remote account, installation id, or
adding or replacing a scope
``change`` that only narrows scopes     connected                    same
``change`` with nothing different       connected                    same (no-op)
======================================  ===========================  ==========

A scope change moves the generation unless the new set is a subset of the old one
(:func:`authority_moves`): OAuth scopes are independent grants (RFC 6749 3.3), and a
refresh may narrow them within one grant (RFC 6749 6), so a narrower set cannot let
queued work reach another identity or do more than it was admitted to do; at worst the
provider refuses it. Any added scope moves it. The Runtime's connect flows
(:mod:`daemon.core.connect_flows`) use the same rule.
Anything else (a change while disconnected, a reconnect while connected, a second
``connect``) is refused with a stable reason.

The durable binding is the authority for new work
-------------------------------------------------
Which remote account (and app installation, and issuer) new work reaches is the durable
fact, never the ``[[bindings]]`` TOML, which bootstraps the row once and afterwards
supplies only configuration (endpoint, auth kind, quota scopes). So the remote links a
command may use are those of :func:`scope_digest` of the principal it runs under: after
a rebind to another account, a record linked only under the old account has no link in
the new scope, and its command is refused before dispatch (``no_remote_link``) rather
than sent to the new account with the old account's remote id. :func:`config_drift`
names what the TOML says differently from the durable fact (logged at start, shown by
``integrationd binding status``); the durable fact wins.
"""

from __future__ import annotations

import enum

import attrs

from daemon.core.identity import integration_scope_digest


class PrincipalKind(enum.StrEnum):
    SHARED = "shared"
    PER_USER = "per_user"


class BindingState(enum.StrEnum):
    CONNECTED = "connected"
    DISCONNECTED = "disconnected"


class BindingEvent(enum.StrEnum):
    CONNECT = "connect"
    DISCONNECT = "disconnect"
    RECONNECT = "reconnect"
    CHANGE = "change"


def authority_moves(before: BindingIdentity, after: BindingIdentity) -> bool:
    """Whether work pinned under ``before`` could reach another identity or authority
    under ``after``: any identity field differs, or a scope was added."""
    if attrs.evolve(before, scopes=after.scopes) != after:
        return True
    return not set(after.scopes) <= set(before.scopes)


def _scope_set(scopes: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(sorted(set(scopes)))


@attrs.frozen(kw_only=True)
class BindingIdentity:
    """What the provider sees behind a binding: any difference can retarget work."""

    issuer: str
    remote_account_id: str
    remote_subject: str
    installation_id: str = ""
    scopes: tuple[str, ...] = attrs.field(default=(), converter=_scope_set)


@attrs.frozen(kw_only=True)
class BindingFacts:
    binding_id: str
    kind: PrincipalKind
    org_id: str
    app_installation_id: str
    provider: str
    # Per-user principals: whose grant this is (empty for shared principals).
    user_id: str = ""
    identity: BindingIdentity
    generation: int
    state: BindingState


class BindingRefused(Exception):
    """A transition that is not legal now; ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def connect(*, binding_id: str, kind: PrincipalKind, org_id: str, app_installation_id: str,
            provider: str, identity: BindingIdentity, user_id: str = "") -> BindingFacts:
    if kind is PrincipalKind.PER_USER and not user_id:
        raise BindingRefused("user_required", "a per-user principal names its user")
    if kind is PrincipalKind.SHARED and user_id:
        raise BindingRefused("user_not_allowed", "a shared principal belongs to no user")
    for name, value in (("binding_id", binding_id), ("org_id", org_id),
                        ("provider", provider), ("issuer", identity.issuer),
                        ("remote_account_id", identity.remote_account_id),
                        ("remote_subject", identity.remote_subject)):
        if not value:
            raise BindingRefused("missing_field", f"{name} must not be empty")
    return BindingFacts(binding_id=binding_id, kind=kind, org_id=org_id,
                        app_installation_id=app_installation_id, provider=provider,
                        user_id=user_id, identity=identity, generation=1,
                        state=BindingState.CONNECTED)


def transition(current: BindingFacts, event: BindingEvent,
               identity: BindingIdentity | None = None) -> BindingFacts:
    """The binding after ``event`` (``identity`` for ``reconnect`` and ``change``)."""
    match event, current.state:
        case BindingEvent.CONNECT, _:
            raise BindingRefused("already_connected" if current.state is BindingState.CONNECTED
                                 else "use_reconnect",
                                 f"binding {current.binding_id} already exists")
        case BindingEvent.DISCONNECT, BindingState.CONNECTED:
            return attrs.evolve(current, state=BindingState.DISCONNECTED)
        case BindingEvent.DISCONNECT, BindingState.DISCONNECTED:
            return current  # idempotent: already disconnected
        case BindingEvent.RECONNECT, BindingState.DISCONNECTED:
            return attrs.evolve(current, state=BindingState.CONNECTED,
                                identity=identity or current.identity,
                                generation=current.generation + 1)
        case BindingEvent.RECONNECT, BindingState.CONNECTED:
            raise BindingRefused("not_disconnected",
                                 f"binding {current.binding_id} is connected: disconnect first")
        case BindingEvent.CHANGE, BindingState.CONNECTED:
            if identity is None:
                raise BindingRefused("missing_field", "a change names the new identity")
            if identity == current.identity:
                return current
            bump = 1 if authority_moves(current.identity, identity) else 0
            return attrs.evolve(current, identity=identity, generation=current.generation + bump)
        case BindingEvent.CHANGE, BindingState.DISCONNECTED:
            raise BindingRefused("disconnected",
                                 f"binding {current.binding_id} is disconnected: reconnect it")
    raise AssertionError(f"unhandled {event} in {current.state}")  # pragma: no cover


def dispatchable(facts: BindingFacts | None, pinned_generation: int) -> str | None:
    """Why work pinned to ``pinned_generation`` may not use this binding now (None: it may)."""
    if facts is None:
        return "binding_missing"
    if facts.state is not BindingState.CONNECTED:
        return "binding_disconnected"
    if facts.generation != pinned_generation:
        return "binding_generation"
    return None


def scope_digest(facts: BindingFacts) -> str:
    """The IntegrationScopeDigest of new work under this principal: its durable remote
    account (docs/identity.md), whatever the configuration's bootstrap value says."""
    return integration_scope_digest(facts.org_id, facts.app_installation_id, facts.provider,
                                    facts.identity.remote_account_id)


@attrs.frozen
class Drift:
    """One identity field the configuration states differently from the durable fact."""

    field: str
    configured: str
    durable: str


def config_drift(configured: BindingFacts, durable: BindingFacts) -> tuple[Drift, ...]:
    """Where the bootstrap facts of a ``[[bindings]]`` entry (``configured``) disagree with
    the durable row: the generation, the remote account, and the installation id when
    the configuration names one. The issuer is not compared: it bootstraps from the
    endpoint URL, which stays configuration (moving the endpoint is not a rebind)."""
    pairs = [("generation", str(configured.generation), str(durable.generation)),
             ("remote_account_id", configured.identity.remote_account_id,
              durable.identity.remote_account_id)]
    if configured.identity.installation_id:
        pairs.append(("installation_id", configured.identity.installation_id,
                      durable.identity.installation_id))
    return tuple(Drift(f, c, d) for f, c, d in pairs if c != d)
