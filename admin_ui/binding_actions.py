"""The console's binding transitions (seed 8.1): every transition the CLI and the
Runtime's connect flows make, except ``connect``.

An operator who sees a binding misbehave (a compromised token, an account moved) stops
dispatch under it (``disconnect``: the generation is kept, queued work waits) and later
connects it again (``reconnect``: the generation moves, so work admitted under the old
one fails closed and never runs with the new authority); both are the CLI's
:meth:`~storage.principals.PrincipalBindings.binding_transition`.

The identity flows (``change_issuer``, ``reinstall``, ``rebind``, ``change_scopes``) are
the rows of :data:`daemon.core.connect_flows.FLOWS`, applied by
:meth:`~storage.principals.PrincipalBindings.binding_operator_flow`: each may change
only its row's fields, moves the generation as the row says (a scope change that only
narrows keeps it) and hands over no grant.

Each is a compare-and-swap on the generation the operator saw on the page, needs the
operator or admin role, the CSRF token and a reason, and is audited with the facts
before and after in the same transaction. A refusal writes nothing and shows the page as
it is now with the stable reason code and why.
"""

from __future__ import annotations

from quart import Blueprint, redirect, request
from quart.wrappers import Response
from werkzeug.datastructures import MultiDict
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui.api import bindings_with_principals
from admin_ui.auth import current_principal, require
from admin_ui.context import console
from admin_ui.errors import BadInput
from admin_ui.filters import reason_from
from admin_ui.render import page
from daemon.api.flow_validation import MAX_SCOPES
from daemon.api.validation import MAX_ID_CHARS
from daemon.core.connect_flows import FLOWS, OPERATOR_FLOWS, Flow
from daemon.core.principals import BindingEvent, BindingRefused
from storage.port import WorkConflict
from storage.principals import Actor

CONSOLE_TRANSITIONS = (BindingEvent.DISCONNECT, BindingEvent.RECONNECT)
# Every identity field a form may name (each flow's row says which it may change).
IDENTITY_FIELDS = ("issuer", "remote_account_id", "remote_subject", "installation_id",
                   "scopes")
# Refusals that are the operator's input, not the binding's state.
_INPUT_REFUSALS = frozenset({"field_not_allowed", "missing_field"})

bp = Blueprint("binding_actions", __name__)


def _generation(value: object) -> int:
    try:
        generation = int(str(value))
    except ValueError:
        raise BadInput("the generation you saw is required (a whole number)") from None
    if generation < 1:
        raise BadInput("the generation you saw is required (a whole number)")
    return generation


def _text(name: str, value: str) -> str:
    text = value.strip()
    if len(text) > MAX_ID_CHARS or not text.isprintable() or any(c.isspace() for c in text):
        raise BadInput(f"invalid_input: {name} must be at most {MAX_ID_CHARS} printable"
                       " characters without spaces")
    return text


def _scopes(value: str) -> tuple[str, ...]:
    scopes = tuple(s for s in value.replace(",", " ").split() if s)
    if not scopes:
        raise BadInput("invalid_input: name at least one scope (comma or space separated)")
    if len(scopes) > MAX_SCOPES:
        raise BadInput(f"invalid_input: at most {MAX_SCOPES} scopes")
    return tuple(_text("a scope", s) for s in scopes)


def identity_changes(flow: Flow, form: MultiDict[str, str]) -> dict[str, object]:
    """The identity fields the form names (a blank one is kept as it is)."""
    changes: dict[str, object] = {}
    for name in IDENTITY_FIELDS:
        raw = form.get(name)
        if raw is None or (not raw.strip() and name != "scopes"):
            continue
        changes[name] = _scopes(raw) if name == "scopes" else _text(name, raw)
    if not changes and flow is not Flow.REINSTALL:
        fields = " or ".join(sorted(FLOWS[flow].fields))
        raise BadInput(f"invalid_input: {flow.value} names the new {fields}")
    return changes


async def _refused(status: int, error: str) -> Response:
    """The bindings page as it is now, with why nothing was written."""
    return await page("bindings.html", status=status, error=error,
                      doc=await bindings_with_principals(console().view))


@bp.post("/admin/bindings/<binding_id>/<verb>")
@require("bindings.transition")
async def transition(binding_id: str, verb: str) -> Response | WerkzeugResponse:
    view = console().view
    events = {e.value: e for e in CONSOLE_TRANSITIONS}
    flows = {f.value: f for f in OPERATOR_FLOWS}
    if verb not in events and verb not in flows:
        names = ", ".join([*events, *flows])
        return await _refused(404, f"unknown_action: no console action {verb[:64]!r}"
                              f" ({names})")
    principal = current_principal()
    assert principal is not None
    form = await request.form
    notice = f"binding_{verb}"
    try:
        reason = reason_from(form.get("reason"))
        generation = _generation(form.get("generation"))
        actor = Actor(principal.name, principal.role, reason)
        if verb in events:
            await view.store.binding_transition(
                binding_id, events[verb], actor, expected_generation=generation,
                now_us=view.clock.now_us())
        else:
            flow = flows[verb]
            plan = await view.store.binding_operator_flow(
                binding_id, flow, actor, expected_generation=generation,
                now_us=view.clock.now_us(), changes=identity_changes(flow, form))
            if plan.before == plan.after:
                notice = "binding_unchanged"
            elif not plan.bumped:
                notice = "binding_generation_kept"
    except BadInput as exc:
        return await _refused(400, str(exc))
    except BindingRefused as exc:
        # A stale generation, an unknown binding, a transition its state does not allow
        # (409), a field the flow may not change (400): nothing was written; the page
        # shows the binding as it is now.
        return await _refused(400 if exc.reason in _INPUT_REFUSALS else 409, str(exc))
    except WorkConflict as exc:
        return await _refused(409, str(exc))
    return redirect(f"/admin/bindings?notice={notice}")
