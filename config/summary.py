"""What ``integrationd check-config`` prints: every setting, secrets only as set/unset.

Generic over the settings model, so a key added to :mod:`config.settings` is printed
without anyone remembering to list it here. A :class:`Secret` (and an operator's
password hash, which is secret material too) is shown only as ``"set"`` or ``"unset"``;
a storage URL loses any password it might carry.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import attrs

from config.settings import Operator, Secret, Settings

# Fields that hold secret material without being a Secret value.
_SECRET_FIELDS = {(Operator, "password_hash")}


def describe_settings(settings: Settings, families: Collection[str],
                      describe_url: Callable[[str], str]) -> dict[str, Any]:
    """Every section of ``settings`` as plain JSON values; ``families`` are the
    work families this binary knows (each printed with its effective values)."""
    doc: dict[str, Any] = {}
    for field in attrs.fields(Settings):
        value = getattr(settings, field.name)
        if field.name == "families":
            doc["families"] = {name: _describe(settings.family(name)) for name in families}
        elif field.name == "base_dir":
            doc["base_dir"] = value
        elif isinstance(value, tuple):
            doc[field.name] = [_describe(v) for v in value]
        else:
            doc[field.name] = _describe(value)
    doc["storage"]["url"] = describe_url(settings.storage.url)
    return doc


def _describe(value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in attrs.fields(type(value)):
        item = getattr(value, field.name)
        if isinstance(item, Secret) or (type(value), field.name) in _SECRET_FIELDS:
            out[field.name] = "set" if item else "unset"
        elif item is None and "Secret" in str(field.type):
            out[field.name] = "unset"
        elif isinstance(item, tuple) and item and attrs.has(type(item[0])):
            out[field.name] = [_describe(v) for v in item]  # e.g. a binding's quota scopes
        else:
            out[field.name] = item
    return out
