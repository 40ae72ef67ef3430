"""The console's binding transitions: disconnect and reconnect (seed 8.1).

An operator who sees a binding misbehave (a compromised token, an account moved) stops
dispatch under it (``disconnect``: the generation is kept, queued work waits) and later
connects it again (``reconnect``: the generation moves, so work admitted under the old
one fails closed and never runs with the new authority). Each is the same
compare-and-swap the CLI's ``integrationd binding`` makes, on the generation the operator
saw on the page, audited with the operator's reason in the same transaction. Identity
and scope changes stay with the CLI and the Runtime's connect flows, which carry them.
"""

from __future__ import annotations

from quart import Blueprint, redirect, request
from quart.wrappers import Response
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui.api import bindings_with_principals
from admin_ui.auth import current_principal, require
from admin_ui.context import console
from admin_ui.errors import BadInput
from admin_ui.filters import reason_from
from admin_ui.render import page
from daemon.core.principals import BindingEvent, BindingRefused
from storage.port import WorkConflict
from storage.principals import Actor

CONSOLE_TRANSITIONS = (BindingEvent.DISCONNECT, BindingEvent.RECONNECT)

bp = Blueprint("binding_actions", __name__)


def _generation(value: object) -> int:
    try:
        generation = int(str(value))
    except ValueError:
        raise BadInput("the generation you saw is required (a whole number)") from None
    if generation < 1:
        raise BadInput("the generation you saw is required (a whole number)")
    return generation


async def _refused(status: int, error: str) -> Response:
    """The bindings page as it is now, with why nothing was written."""
    return await page("bindings.html", status=status, error=error,
                      doc=await bindings_with_principals(console().view))


@bp.post("/admin/bindings/<binding_id>/<verb>")
@require("bindings.transition")
async def transition(binding_id: str, verb: str) -> Response | WerkzeugResponse:
    view = console().view
    events = {e.value: e for e in CONSOLE_TRANSITIONS}
    if verb not in events:
        return await _refused(404, f"no console action {verb!r} (disconnect or reconnect)")
    principal = current_principal()
    assert principal is not None
    form = await request.form
    try:
        reason = reason_from(form.get("reason"))
        generation = _generation(form.get("generation"))
        await view.store.binding_transition(
            binding_id, events[verb], Actor(principal.name, principal.role, reason),
            expected_generation=generation, now_us=view.clock.now_us())
    except BadInput as exc:
        return await _refused(400, str(exc))
    except (BindingRefused, WorkConflict) as exc:
        # A stale generation, an unknown binding, a transition its state does not allow:
        # nothing was written; the page shows the binding as it is now.
        return await _refused(409, str(exc))
    return redirect(f"/admin/bindings?notice=binding_{verb}")
