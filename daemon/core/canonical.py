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
import re
from typing import Any


class NotCanonical(ValueError):
    """The value cannot be encoded canonically (a float, a non-string key...)."""


def _plain(value: Any) -> bool:
    """Whether ``value`` is canonical JSON, without naming where it is not (the common
    case, checked on every command the intake admits, builds no paths)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is dict:
        return all(type(key) is str and _plain(item) for key, item in value.items())
    if kind is list:
        return all(_plain(item) for item in value)
    return False


def _check(value: Any, path: str) -> None:
    """Raise :class:`NotCanonical` naming where ``value`` is not canonical JSON."""
    if _plain(value):
        return
    _where(value, path)


def _where(value: Any, path: str) -> None:
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return
    if isinstance(value, float):
        raise NotCanonical(f"{path or 'value'}: floats are not canonical")
    if isinstance(value, list):
        for i, item in enumerate(value):
            _where(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotCanonical(f"{path or 'value'}: object keys must be strings")
            _where(item, f"{path}.{key}" if path else key)
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


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def is_digest(text: str) -> bool:
    """``sha256:`` and 64 lowercase hex digits, nothing else."""
    return _DIGEST.fullmatch(text) is not None
