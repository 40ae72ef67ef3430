"""Canonical JSON and digests (pure).

Canonical form: UTF-8, object keys sorted, no insignificant whitespace, no
floats (a float's text is not canonical across languages; amounts travel as
strings or integers). Digests are ``sha256:`` + lowercase hex of those bytes.
Both sides of every contract (integrationd, the Runtime) use these functions,
so equal values always produce equal bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


class NotCanonical(ValueError):
    """The value cannot be encoded canonically (a float, a non-string key...)."""


def _check(value: Any, path: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return
    if isinstance(value, float):
        raise NotCanonical(f"{path or 'value'}: floats are not canonical")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotCanonical(f"{path or 'value'}: object keys must be strings")
            _check(item, f"{path}.{key}" if path else key)
        return
    raise NotCanonical(f"{path or 'value'}: {type(value).__name__} is not JSON")


def canonical_bytes(value: Any) -> bytes:
    """The canonical encoding of a JSON value."""
    _check(value, "")
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical encoding."""
    return sha256_digest(canonical_bytes(value))


def is_digest(text: str) -> bool:
    prefix = "sha256:"
    hexpart = text[len(prefix) :]
    return (
        text.startswith(prefix)
        and len(hexpart) == 64
        and all(c in "0123456789abcdef" for c in hexpart)
    )
