"""Response builders: HubSpot's JSON error envelope and compact JSON bodies."""

from __future__ import annotations

import json
import uuid
from typing import Final

from sandbox.h11_server import Response

_JSON_HEADERS: Final = (("content-type", "application/json;charset=utf-8"),)
_CATEGORIES: Final = {
    400: "VALIDATION_ERROR",
    401: "INVALID_AUTHENTICATION",
    403: "MISSING_SCOPES",
    404: "OBJECT_NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    429: "RATE_LIMITS",
}


def json_response(status: int, doc: object, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    body = json.dumps(doc, separators=(",", ":")).encode()
    return Response(status, body, _JSON_HEADERS + headers)


def error_response(
    status: int, message: str, headers: tuple[tuple[str, str], ...] = (), **extra: str
) -> Response:
    """HubSpot's error envelope; categories follow HubSpot's names where it has one."""
    category = _CATEGORIES.get(status, "INTERNAL_ERROR" if status >= 500 else "ERROR")
    doc = {
        "status": "error",
        "category": category,
        "message": message,
        "correlationId": str(uuid.uuid4()),
        **extra,
    }
    return json_response(status, doc, headers)
