"""Errors a console user can cause, and how domain errors map onto HTTP.

Every error has a stable ``code`` and a one-line ``message``. The JSON API
answers ``{"error": code, "message": message}``; pages render the same
message in a banner. Storage failures become a "database unreachable" answer
(503) whose message is fixed text: the driver's own message goes to the log,
never to the client.
"""

from __future__ import annotations

from daemon.services.families import UnknownFamily
from daemon.services.operator_api import BadRequest, NotAuthorized
from storage.links import LinkRefused
from storage.port import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    StorageError,
    WorkConflict,
    WorkNotFound,
)

DB_UNREACHABLE = (
    "The database is unreachable. Nothing was changed; pages show no stored data until it"
    " is back."
)
DB_COMMIT_UNKNOWN = (
    "The database connection was lost while committing: the action may or may not have"
    " been applied. Check the item and the audit log before trying again."
)
DB_ERROR = "The database could not complete the request. Nothing was changed; try again."


class ConsoleError(Exception):
    """An error with an HTTP status, a stable code and a message safe to show."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, code: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status


class Unauthenticated(ConsoleError):
    status = 401
    code = "unauthenticated"


class Forbidden(ConsoleError):
    status = 403
    code = "forbidden"


class CsrfFailed(ConsoleError):
    status = 403
    code = "csrf_failed"


class BadFilter(ConsoleError):
    status = 400
    code = "bad_filter"


class BadInput(ConsoleError):
    status = 400
    code = "bad_request"


class NotFound(ConsoleError):
    status = 404
    code = "not_found"


class Conflict(ConsoleError):
    status = 409
    code = "conflict"


class UnsupportedMediaType(ConsoleError):
    status = 415
    code = "unsupported_media_type"


class DatabaseDown(ConsoleError):
    status = 503
    code = "database_unavailable"


def classify(exc: Exception) -> ConsoleError | None:
    """The console error for a domain exception, or ``None`` if it is a bug."""
    if isinstance(exc, ConsoleError):
        return exc
    if isinstance(exc, BadRequest):
        return BadInput(str(exc))
    if isinstance(exc, NotAuthorized):
        return Forbidden(str(exc))
    if isinstance(exc, WorkNotFound):
        return NotFound(f"no work item {exc.work_id}")
    if isinstance(exc, LinkRefused):
        return Conflict(str(exc), code=exc.code)
    if isinstance(exc, WorkConflict):
        return Conflict(str(exc))
    if isinstance(exc, UnknownFamily):
        return Conflict(
            f"work family {exc.name!r} is not run by this build: it cannot be replayed here",
            code="family_not_runnable",
        )
    if isinstance(exc, DatabaseUnavailable):
        return DatabaseDown(DB_UNREACHABLE)
    if isinstance(exc, CommitOutcomeUnknown):
        return DatabaseDown(DB_COMMIT_UNKNOWN, code="commit_outcome_unknown")
    if isinstance(exc, StorageError):
        return DatabaseDown(DB_ERROR, code="database_error")
    return None
