"""The content of one Catalog revision as canonical JSON, and back (pure).

A revision's content is ``{"bindings": [...], "definitions": [...]}``: every
L1 provider definition as parsed from its TOML file, and every L2 binding's
non-secret fields. Canonical JSON has no floats (``daemon/core/canonical.py``),
while TOML definitions and bindings carry some (``max_in_flight = 30.0``), so
a float travels as the one-key object ``{"$float": "30.0"}`` (its ``repr``,
which round-trips exactly). :func:`encode` and :func:`decode` are inverse on
every value TOML can produce except dates and times, which no definition uses
and :func:`encode` refuses. The digest of a revision is :func:`content_digest`
of its encoded content: equal content, equal digest, whatever the revision number.
"""

from __future__ import annotations

import json
import math
from typing import Any

from daemon.core.canonical import NotCanonical, canonical_bytes, sha256_digest

FLOAT_TAG = "$float"


class BadContent(ValueError):
    """Stored content that is not an encoded revision (never expected: a bug or tampering)."""


def encode(value: Any, path: str = "") -> Any:
    """``value`` with every float replaced by its tagged form; refuses non-JSON values."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotCanonical(f"{path or 'value'}: {value!r} is not a finite number")
        return {FLOAT_TAG: repr(value)}
    if isinstance(value, dict):
        if FLOAT_TAG in value:
            raise NotCanonical(f"{path or 'value'}: the key {FLOAT_TAG!r} is reserved")
        return {k: encode(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, bool | int | str):
        return value
    raise NotCanonical(f"{path or 'value'}: {type(value).__name__} is not JSON")


def decode(value: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, dict):
        if FLOAT_TAG in value:
            text = value[FLOAT_TAG]
            if len(value) != 1 or not isinstance(text, str):
                raise BadContent(f"a {FLOAT_TAG!r} object must hold only a decimal string")
            try:
                return float(text)
            except ValueError:
                raise BadContent(f"{text!r} is not a number") from None
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def content_bytes(definitions: list[Any], bindings: list[Any],
                  object_bindings: list[Any] | None = None) -> bytes:
    """The canonical bytes of a revision holding these definitions and bindings (and L2
    object bindings: the key is absent when there are none, so a revision made before
    they existed keeps its bytes and digest)."""
    doc: dict[str, Any] = {"bindings": bindings, "definitions": definitions}
    if object_bindings:
        doc["object_bindings"] = object_bindings
    return canonical_bytes(encode(doc))


def content_digest(data: bytes) -> str:
    return sha256_digest(data)


def parse_content(text: str) -> tuple[list[Any], list[Any]]:
    """(definitions, bindings) from stored canonical content."""
    definitions, bindings, _ = parse_content_with_objects(text)
    return definitions, bindings


def parse_content_with_objects(text: str) -> tuple[list[Any], list[Any], list[Any]]:
    """(definitions, bindings, object bindings) from stored canonical content."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise BadContent(f"stored content is not JSON: {exc}") from None
    doc = decode(raw)
    if not isinstance(doc, dict) or not (
            {"bindings", "definitions"} <= set(doc)
            <= {"bindings", "definitions", "object_bindings"}):
        raise BadContent("stored content must hold exactly bindings and definitions"
                         " (and object_bindings)")
    definitions, bindings = doc["definitions"], doc["bindings"]
    objects = doc.get("object_bindings", [])
    if not all(isinstance(v, list) for v in (definitions, bindings, objects)):
        raise BadContent("bindings, definitions and object_bindings must be arrays")
    return definitions, bindings, objects
