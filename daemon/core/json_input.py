"""Parsing a JSON request body from outside (pure): strict UTF-8, bounded nesting.

``json.loads`` alone lets three kinds of bad input escape as something other
than "this is not valid JSON": bytes that are not UTF-8 (it guesses UTF-16 or
UTF-32 from the first bytes, and a text decode raises its own error), nesting
deep enough to exhaust the interpreter's recursion limit (``[`` x 1000 raises
``RecursionError``, which is not a ``ValueError``), and documents that parse
but are nested so deeply that any recursive walk over them later (canonical
encoding, validation, the answer's encoder) fails far from the parser.
:func:`parse_json` turns each into a :class:`BadJson` with a stable reason,
and bounds nesting at :data:`MAX_DEPTH` (our documents nest a handful of
levels), so everything after it may walk the value recursively.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32


class BadJson(ValueError):
    """The body is not a JSON document we accept; ``reason`` is stable."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def depth(value: Any) -> int:
    """How deeply ``value`` nests arrays and objects (a scalar is 0), without recursion."""
    if not isinstance(value, dict | list):
        return 0
    deepest = 0
    # Only containers are stacked (a body is mostly scalars): each with its own level.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, level + 1) for child in children
                     if isinstance(child, dict | list))
    return deepest


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity, -Infinity (RFC 8259)


def parse_json(raw: bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``raw`` (UTF-8, at most ``max_depth`` levels), or :class:`BadJson`.

    Reasons: ``not_utf8``, ``malformed`` (including ``NaN`` and ``Infinity``, which
    RFC 8259 does not allow), ``too_deep``.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadJson("not_utf8", "the body is not valid UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise BadJson("too_deep",
                      f"the body nests arrays or objects deeper than {max_depth} levels"
                      ) from None
    except ValueError:
        raise BadJson("malformed", "the body is not valid JSON") from None
    if depth(value) > max_depth:
        raise BadJson("too_deep",
                      f"the body nests arrays or objects deeper than {max_depth} levels")
    return value
