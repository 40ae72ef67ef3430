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

Numbers from providers (:func:`loads_exact`): a JSON number with a fraction or an
exponent becomes its exact decimal text, a *string* (``12.50`` -> ``"12.5"``,
``2e1`` -> ``"20"``), never a binary float: canonical JSON has no floats (amounts travel
as strings or integers, :mod:`daemon.core.canonical`), and a float would change the
value. Integers stay integers. A number whose exact text is longer than
:data:`MAX_DECIMAL_CHARS` (``1e999999``) is :class:`NotExact`.
"""

from __future__ import annotations

import decimal
import json
from typing import Any

MAX_DEPTH = 32
# The longest exact decimal text a provider's number may have (sign and point included):
# 40-odd digits hold any amount or score; ``1e999999`` written out would be a megabyte.
MAX_DECIMAL_CHARS = 48


class BadJson(ValueError):
    """The body is not a JSON document we accept; ``reason`` is stable."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class NotExact(ValueError):
    """A JSON number that has no exact decimal text of at most MAX_DECIMAL_CHARS."""


def decimal_text(literal: str) -> str:
    """The exact decimal text of a JSON number literal: no exponent, no trailing zeros
    after the point, no point when integral, ``0`` for any zero."""
    try:
        sign, digits, exponent = decimal.Decimal(literal).as_tuple()
    except decimal.InvalidOperation:
        raise NotExact(f"{literal[:40]!r} is not a number") from None
    if not isinstance(exponent, int):  # NaN or infinity: not JSON
        raise NotExact(f"{literal[:40]!r} is not a finite number")
    figures = list(digits)
    while len(figures) > 1 and figures[-1] == 0 and exponent < 0:
        figures.pop()
        exponent += 1
    if not any(figures):
        return "0"
    # The written-out length, known before anything is written (1e999999 is refused).
    length = (len(figures) + exponent if exponent >= 0
              else max(len(figures), 1 - exponent) + 1) + sign
    if length > MAX_DECIMAL_CHARS:
        raise NotExact(f"a number needs {length} characters written out exactly"
                       f" (at most {MAX_DECIMAL_CHARS})")
    text = "".join(map(str, figures))
    if exponent >= 0:
        text += "0" * exponent
    else:
        text = text.rjust(1 - exponent, "0")
        text = f"{text[:exponent]}.{text[exponent:]}"
    return ("-" if sign else "") + text


def loads_exact(raw: bytes | str) -> Any:
    """``json.loads`` for a provider's document: fractional numbers become their exact
    decimal text (:func:`decimal_text`); NaN and Infinity are refused. Raises ValueError
    (:class:`NotExact` for a number too long to write out)."""
    return json.loads(raw, parse_float=decimal_text, parse_constant=_refuse_constant)


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
