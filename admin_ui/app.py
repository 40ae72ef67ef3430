"""The admin listener's application: ``/metrics``, ``/healthz``, ``/readyz`` and the
operator console under ``/admin/`` (pages) and ``/admin/api/`` (JSON + OpenAPI).

Theory of operation
-------------------
``create_app`` takes a :class:`ReplicaView`, the read-only window the replica
gives its HTTP surface (plus its store for operator actions), so the app can be
served (and tested) apart from the work loop. Module map:

* ``auth`` (who: sessions or proxy header; CSRF; ``require(action)``),
  ``sessions`` (signed cookies), ``passwords`` (argon2), ``access`` (roles);
* ``readmodels`` (overview, from the replica's depth/throughput history),
  ``queries`` (work, DLQ, audit; bounded), ``serialize`` (JSON shapes: never a
  payload, token or secret), ``filters`` (strict input parsing -> 400);
* ``actions`` (replay, audited cancel, bulk DLQ replay: shared with the CLI);
* ``api`` (JSON), ``pages`` + ``pages_work`` + ``signin`` (HTML), ``openapi``;
* ``extensions`` (lineage sections, blueprints, nav and actions that later
  services add without editing the console).

Every error a user can cause becomes ``{"error", "message"}`` (API) or a page
with a banner; storage failures become "database unreachable" (503), with the
driver's message in the log only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import quote

import trio
from quart import Response, g, redirect, request
from quart_trio import QuartTrio
from werkzeug.exceptions import MethodNotAllowed
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui import api, binding_actions, cutover, find, pages, pages_work, signin
from admin_ui.auth import is_api_request, resolve_principal, write_session_cookie
from admin_ui.context import EXTENSION_KEY, Console, console
from admin_ui.errors import ConsoleError, DatabaseDown, Unauthenticated, classify
from admin_ui.extensions import ConsoleExtensions
from admin_ui.render import age_since, fmt_age, fmt_duration_us, fmt_iso, fmt_ts, page
from admin_ui.view import ReplicaView
from daemon.core.human_time import span_text
from daemon.services import logs
from daemon.services.families import UnknownFamily
from daemon.services.http_guard import guard_app
from daemon.services.operator_api import BadRequest, NotAuthorized
from storage.port import StorageError, WorkConflict, WorkNotFound

__all__ = ["METRICS_CONTENT_TYPE", "ReplicaView", "console_factory", "create_app"]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_BODY_BYTES = 64 * 1024
STATIC_PREFIX = "/admin/static/"
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def _console_request() -> bool:
    return request.path == "/admin" or request.path.startswith("/admin/")


async def _error_response(exc: Exception) -> Response | WerkzeugResponse:
    err = classify(exc)
    if err is None:  # pragma: no cover - handlers are registered for classified types
        raise exc
    if isinstance(err, DatabaseDown):
        logs.warn("admin_storage_error", path=request.path, error=str(exc),
                  kind=type(exc).__name__)
    if is_api_request() or not _console_request():
        return Response(
            _json_text({"error": err.code, "message": err.message}),
            status=err.status,
            content_type="application/json",
        )
    if isinstance(err, Unauthenticated) and not console().proxy_mode:
        target = "/admin/sign-in"
        if request.method == "GET":
            target += "?next=" + _quote(request.full_path.rstrip("?"))
        return redirect(target)
    return await page("error.html", status=err.status, err=err,
                      db_down=isinstance(err, DatabaseDown))


def _json_text(doc: dict[str, object]) -> str:
    return json.dumps(doc)


def _quote(text: str) -> str:
    return quote(text, safe="/")


def create_app(replica: ReplicaView, extensions: ConsoleExtensions | None = None) -> QuartTrio:
    """The admin listener's app; ``extensions`` adds pages, API routes and lineage."""
    app = QuartTrio(__name__, static_url_path="/admin/static", static_folder="static",
                    template_folder="templates")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions[EXTENSION_KEY] = Console.build(replica, extensions)
    app.add_template_filter(fmt_ts, "ts")
    app.add_template_filter(fmt_age, "age")
    app.add_template_filter(age_since, "since")
    app.add_template_filter(fmt_duration_us, "duration_us")
    app.add_template_filter(fmt_iso, "iso")
    app.add_template_filter(span_text, "span_s")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(replica.metrics_text(), content_type=METRICS_CONTENT_TYPE)

    @app.get("/healthz")
    async def healthz() -> tuple[dict[str, object], int]:
        return {"status": "ok"}, 200

    @app.get("/readyz")
    async def readyz() -> tuple[dict[str, object], int]:
        ready, detail = replica.readiness()
        return {"ready": ready, **detail}, 200 if ready else 503

    @app.before_request
    async def before() -> None:
        g.started = trio.current_time()
        if _console_request() and not request.path.startswith(STATIC_PREFIX):
            await resolve_principal()

    @app.after_request
    async def after(response: Response) -> Response:
        if _console_request():
            if not request.path.startswith(STATIC_PREFIX):
                response = write_session_cookie(response)
                response.headers["Cache-Control"] = "no-store"
            response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
            response.headers["X-Content-Type-Options"] = "nosniff"
            response.headers["X-Frame-Options"] = "DENY"
            response.headers["Referrer-Policy"] = "same-origin"
        started = g.get("started")
        if isinstance(started, float):
            elapsed_ms = (trio.current_time() - started) * 1000
            response.headers["Server-Timing"] = f"app;dur={elapsed_ms:.2f}"
        return response

    for kind in (ConsoleError, StorageError, BadRequest, NotAuthorized, UnknownFamily,
                 WorkConflict, WorkNotFound):
        app.register_error_handler(kind, _error_response)

    @app.errorhandler(404)
    async def not_found(_: Exception) -> tuple[dict[str, object], int]:
        return {"error": "not_found", "message": "no such route"}, 404

    @app.errorhandler(405)
    async def not_allowed(exc: Exception) -> tuple[dict[str, object], int, dict[str, str]]:
        # RFC 9110 section 15.5.6: a 405 names the methods the target supports.
        allowed = exc.valid_methods if isinstance(exc, MethodNotAllowed) else None
        return ({"error": "method_not_allowed", "message": "method not allowed here"}, 405,
                {"Allow": ", ".join(sorted(allowed))} if allowed else {})

    @app.errorhandler(413)
    async def too_large(_: Exception) -> tuple[dict[str, object], int]:
        return {"error": "payload_too_large", "message": "the request body is too large"}, 413

    @app.errorhandler(500)
    async def internal_error(_: Exception) -> tuple[dict[str, object], int]:
        # A bug: Quart has logged the traceback; the client gets one JSON line.
        return {"error": "internal_error",
                "message": "the request failed inside integrationd; see its log"}, 500

    for blueprint in (signin.bp, pages.bp, pages_work.bp, cutover.bp, api.bp,
                      binding_actions.bp, find.bp):
        app.register_blueprint(blueprint)
    for blueprint in console_extensions(app).blueprints:
        app.register_blueprint(blueprint)
    guard_app(app, MAX_BODY_BYTES)
    return app


def console_factory(
    extensions: ConsoleExtensions | None = None,
) -> Callable[[ReplicaView], QuartTrio]:
    """What the composition root hands a replica: builds its admin app, given the replica."""

    def build(replica: ReplicaView) -> QuartTrio:
        return create_app(replica, extensions)

    return build


def console_extensions(app: QuartTrio) -> ConsoleExtensions:
    found = app.extensions[EXTENSION_KEY]
    assert isinstance(found, Console)
    return found.extensions
