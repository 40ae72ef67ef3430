"""Sign-in and sign-out pages (password mode; proxy mode explains itself instead).

A failed sign-in always answers "invalid name or password" with status 401,
after the same argon2 work whatever went wrong; the sign-in form carries a
CSRF token bound to a pre-sign-in session, and a successful sign-in mints a
new session id (so a planted cookie is useless).
"""

from __future__ import annotations

from quart import Blueprint, redirect, request
from quart.wrappers import Response
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui.auth import check_csrf, current_principal, current_session, end_session, start_session
from admin_ui.context import console
from admin_ui.errors import CsrfFailed
from admin_ui.render import page
from daemon.services import logs

bp = Blueprint("signin", __name__)

INVALID = "invalid name or password"


def safe_next(target: str | None) -> str:
    """Only a path inside the console: never another host (open redirect)."""
    if (
        target
        and target.startswith("/admin")
        and not target.startswith("//")
        and "\\" not in target
        and target.isprintable()
        and not target.startswith("/admin/api/")
    ):
        return target
    return "/admin/"


async def _form(status: int = 200, error: str | None = None, name: str = "",
                next_path: str = "/admin/") -> Response:
    c = console()
    if current_session() is None:
        start_session(c.codec.new(None))
    return await page("sign_in.html", status=status, error=error, name=name,
                      next_path=next_path)


@bp.get("/admin/sign-in")
async def sign_in_form() -> Response | WerkzeugResponse:
    next_path = safe_next(request.args.get("next"))
    if console().proxy_mode:
        return await page("proxy_auth.html")
    if current_principal() is not None:
        return redirect(next_path)
    return await _form(next_path=next_path)


@bp.post("/admin/sign-in")
async def sign_in() -> Response | WerkzeugResponse:
    c = console()
    if c.proxy_mode:
        return await page("proxy_auth.html", status=404)
    form = await request.form
    next_path = safe_next(form.get("next"))
    name = form.get("name", "").strip()[:128]
    try:
        await check_csrf(current_session())
    except CsrfFailed:
        return await _form(403, "Your sign-in form expired. Please try again.", name, next_path)
    operator = c.view.settings.operator(name) if name else None
    if not await c.verifier.verify(operator, form.get("password", "")) or operator is None:
        logs.warn("admin_sign_in_failed", known=operator is not None)
        return await _form(401, INVALID, name, next_path)
    start_session(c.codec.new(operator))
    logs.event("admin_signed_in", operator=operator.name, role=operator.role)
    return redirect(next_path)


@bp.post("/admin/sign-out")
async def sign_out() -> WerkzeugResponse:
    principal = current_principal()
    if principal is not None:
        await check_csrf(principal.session)
        logs.event("admin_signed_out", operator=principal.name)
    end_session()
    if console().proxy_mode:
        return redirect("/admin/")
    return redirect("/admin/sign-in?notice=signed_out")
