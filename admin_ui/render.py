"""Render console pages: the shared layout context and the template filters."""

from __future__ import annotations

import datetime as dt
from typing import Any

from quart import render_template, request
from quart.wrappers import Response

from admin_ui.auth import current_principal, current_session, may
from admin_ui.context import console
from admin_ui.extensions import NavItem
from daemon.core.human_time import DASH, span_text, wall_text

NAV: tuple[NavItem, ...] = (
    NavItem("/admin/", "Overview", "console.read"),
    NavItem("/admin/work", "Work items", "work.read"),
    NavItem("/admin/dlq", "DLQ", "dlq.read"),
    NavItem("/admin/audit", "Audit log", "audit.read"),
    NavItem("/admin/find", "Find", "console.read"),
    NavItem("/admin/cutover", "Cutover", "cutover.read"),
    NavItem("/admin/bindings", "Bindings", "console.read"),
    NavItem("/admin/quota", "Quota", "console.read"),
    NavItem("/admin/operators", "Operators", "operators.read"),
)

# Fixed notices a redirect may ask for (never free text from the query string).
NOTICES = {
    "replayed": "Replayed: this is the new item; the original is unchanged.",
    "cancelled": "Cancelled.",
    "cancel_requested": "Cancel requested: the claimant stops and acknowledges it.",
    "signed_out": "Signed out.",
    "binding_disconnect": "Disconnected: nothing is dispatched under this binding until it"
                          " is reconnected.",
    "binding_reconnect": "Reconnected under a new generation: work admitted under the old"
                         " one fails closed.",
    **{f"binding_{flow}": f"{what}: the binding moved to a new generation; work admitted"
                          " under the old one fails closed. A binding with grants has none"
                          " for the new generation until the Runtime hands one over (an S2S"
                          " installation mints its own)."
       for flow, what in (("change_issuer", "Issuer changed"), ("reinstall", "Reinstalled"),
                          ("rebind", "Rebound"), ("change_scopes", "Scopes changed"))},
    "binding_generation_kept": "Scopes narrowed: the generation and its grant are kept"
                               " (a narrower authority cannot retarget queued work).",
    "binding_unchanged": "Nothing was different: nothing was written.",
    **{f"cutover_{verb}": f"Cutover {verb}: done (see the receipts and the audit log)."
       for verb in ("begin", "commit", "rollback", "re-cutover")},
}


def nav_items() -> list[NavItem]:
    items = list(NAV) + list(console().extensions.nav)
    return [i for i in items if may(i.action)]


async def page(template: str, status: int = 200, **context: Any) -> Response:
    c = console()
    principal = current_principal()
    session = current_session()
    csrf = c.codec.csrf_token(session) if session is not None else ""
    notice = NOTICES.get(request.args.get("notice", ""))
    html = await render_template(
        template,
        principal=principal,
        csrf_token=csrf,
        nav=nav_items() if principal else [],
        may=may,
        replica_id=c.view.replica_id,
        replica_state=c.view.state,
        auth_mode=c.view.settings.admin.auth,
        notice=context.pop("notice", notice),
        error=context.pop("error", None),
        db_down=context.pop("db_down", False),
        path=request.path,
        **context,
    )
    response = Response(html, status=status, content_type="text/html; charset=utf-8")
    return response


def fmt_ts(us: int | None) -> str:
    """UTC wall time of an epoch-microsecond value."""
    return DASH if us is None else wall_text(us)


def fmt_age(seconds: float | None) -> str:
    """A short duration: ``42 s``, ``7 min``, ``3.5 h``, ``2.1 d``."""
    return DASH if seconds is None else span_text(seconds)


def fmt_duration_us(us: int | None) -> str:
    """A span of time given in microseconds, as people read it: ``250 ms``, ``10 s``,
    ``7 min``, ``3.5 h``."""
    if us is None:
        return "\u2014"
    if us < 1_000_000:
        return f"{us / 1000:.0f} ms" if us >= 1000 else f"{us} \u00b5s"
    seconds = us / 1_000_000
    if seconds < 90 and seconds != int(seconds):
        return f"{seconds:.1f} s"
    return fmt_age(seconds)


def fmt_iso(us: int | None) -> str:
    """An epoch-microsecond value as an RFC 3339 timestamp (for ``<time datetime>``)."""
    if us is None:
        return ""
    return dt.datetime.fromtimestamp(us / 1_000_000, tz=dt.UTC).isoformat(
        timespec="microseconds").replace("+00:00", "Z")


def age_since(us: int | None) -> str:
    if us is None:
        return "\u2014"
    return fmt_age(max(0.0, (console().view.clock.now_us() - us) / 1_000_000))
