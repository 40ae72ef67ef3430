"""Who is asking: sessions (password mode) or a trusted proxy header (proxy mode),
CSRF checks, and the ``require(action)`` guard every console route carries.

Theory of operation
-------------------
``resolve_principal`` runs before every ``/admin`` request and leaves the
answer in ``g``: a :class:`~admin_ui.sessions.Principal` or ``None`` (with the
reason). ``require(action)`` then decides, in this order:

1. nobody signed in -> 401 (:class:`Unauthenticated`; pages redirect to sign-in);
2. a state-changing method without a valid CSRF token bound to this session,
   or from another origin -> 403 (:class:`CsrfFailed`), nothing changed;
3. the operator's *current* role does not allow the action -> 403.

Proxy mode trusts ``admin.proxy_user_header`` from the proxy (the listener
must be reachable only through it) but the named operator must still exist in
``[[operators]]``; a session cookie is still issued so that CSRF tokens have
something to be bound to.
"""

from __future__ import annotations

import functools
import hmac
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

from quart import g, request
from quart.wrappers import Response

from admin_ui.access import allowed
from admin_ui.context import console
from admin_ui.errors import CsrfFailed, Forbidden, Unauthenticated
from admin_ui.sessions import COOKIE_NAME, COOKIE_PATH, Principal, SessionData

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
API_PREFIX = "/admin/api/"
FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"


def is_api_request() -> bool:
    return request.path.startswith(API_PREFIX)


def current_principal() -> Principal | None:
    principal = g.get("principal")
    return principal if isinstance(principal, Principal) else None


def current_session() -> SessionData | None:
    data = g.get("session")
    return data if isinstance(data, SessionData) else None


def start_session(data: SessionData) -> None:
    """Use ``data`` for the rest of this request and send it as the new cookie."""
    g.session = data
    g.set_cookie = data


def end_session() -> None:
    g.session = None
    g.principal = None
    g.clear_cookie = True


async def resolve_principal() -> None:
    c = console()
    settings = c.view.settings
    g.principal = None
    g.auth_problem = None
    data = c.codec.loads(request.cookies.get(COOKIE_NAME))
    g.session = data
    if c.proxy_mode:
        header = settings.admin.proxy_user_header
        name = request.headers.get(header, "").strip()
        if not name:
            g.auth_problem = ("unauthenticated", f"the proxy did not identify you ({header})")
            return
        operator = settings.operator(name)
        if operator is None:
            g.auth_problem = ("forbidden", f"{name[:64]!r} is not a configured operator")
            return
        if data is None or data.operator != operator.name:
            data = c.codec.new(operator)
            start_session(data)
        g.principal = Principal(operator.name, operator.role, data, c.codec.csrf_token(data))
        return
    if data is None or data.operator is None:
        return
    operator = settings.operator(data.operator)
    if (
        operator is None
        or not operator.password_hash
        or not hmac.compare_digest(data.fingerprint, c.codec.fingerprint(operator))
    ):
        end_session()  # removed operator or changed password: the session is over
        return
    g.principal = Principal(operator.name, operator.role, data, c.codec.csrf_token(data))


def write_session_cookie(response: Response) -> Response:
    """``after_request``: send a new session cookie, or delete the old one."""
    c = console()
    new = g.get("set_cookie")
    if isinstance(new, SessionData):
        response.set_cookie(
            COOKIE_NAME,
            c.codec.dumps(new),
            max_age=max(1, math.ceil(c.codec.remaining_s(new))),
            path=COOKIE_PATH,
            secure=request.scheme == "https",
            httponly=True,
            samesite="Lax",
        )
    elif g.get("clear_cookie"):
        response.delete_cookie(COOKIE_NAME, path=COOKIE_PATH, httponly=True, samesite="Lax",
                               secure=request.scheme == "https")
    return response


def _same_origin(origin: str) -> bool:
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == request.host


async def check_csrf(session: SessionData | None) -> None:
    """Refuse a state-changing request without this session's CSRF token."""
    origin = request.headers.get("Origin")
    if origin is not None and not _same_origin(origin):
        raise CsrfFailed("cross-origin request refused")
    token = request.headers.get(CSRF_HEADER)
    if token is None and not is_api_request() and request.mimetype in FORM_TYPES:
        form = await request.form
        token = form.get(CSRF_FIELD)
    if not console().codec.csrf_ok(session, token):
        where = f"the {CSRF_HEADER} header" if is_api_request() else "the form"
        raise CsrfFailed(
            f"missing or invalid CSRF token in {where}: reload the page and try again"
        )


async def check(action: str) -> Principal:
    principal = current_principal()
    if principal is None:
        problem = g.get("auth_problem")
        if problem and problem[0] == "forbidden":
            raise Forbidden(problem[1])
        raise Unauthenticated(problem[1] if problem else "sign in first")
    if request.method not in SAFE_METHODS:
        await check_csrf(principal.session)
    if not may(action, principal):
        raise Forbidden(f"your role ({principal.role}) may not {action}")
    return principal


def may(action: str, principal: Principal | None = None) -> bool:
    """Whether the current (or given) operator's role allows ``action``."""
    principal = principal or current_principal()
    return principal is not None and allowed(console().actions, principal.role, action)


def require(action: str) -> Callable[[F], F]:
    """Guard a route: signed in, CSRF-checked if it changes state, role allows ``action``."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            await check(action)
            return await fn(*args, **kwargs)

        return cast(F, guarded)

    return decorate
