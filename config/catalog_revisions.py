"""A published Catalog revision's stored content, parsed back into a :class:`Catalog`.

The content holds no secret: a binding's token comes from the current
settings, by binding id (``secrets``). The parsed revision is checked against
the digest it was stored under, so a worker never runs content that differs
from what the command pinned.
"""

from __future__ import annotations

from typing import Any

import attrs

from config.catalog import PRINCIPAL_FIELDS, Catalog, CatalogError, build_catalog
from config.settings import BindingSettings, QuotaScope
from daemon.core.catalog_content import BadContent, content_digest, parse_content_with_objects

_BINDING_FIELDS = frozenset(f.name for f in attrs.fields(BindingSettings)) - PRINCIPAL_FIELDS


def _binding(i: int, fields: Any, secrets: dict[str, BindingSettings]) -> BindingSettings:
    if not isinstance(fields, dict) or not set(fields) <= _BINDING_FIELDS:
        raise CatalogError(f"bindings[{i}]", "not the non-secret fields of a binding")
    try:
        quota = tuple(QuotaScope(**q) for q in fields.get("quota", ()))
        binding = BindingSettings(**{**fields, "quota": quota})
    except TypeError as exc:
        raise CatalogError(f"bindings[{i}]", str(exc)) from None
    current = secrets.get(binding.binding_id)
    if current is None:
        return binding  # no longer configured: no token (and dispatch refuses it)
    # The principal's facts are the current ones: its token, generation and credentials.
    return attrs.evolve(binding, **{f: getattr(current, f) for f in PRINCIPAL_FIELDS})


def catalog_from_content(revision: int, digest: str, content: str,
                         secrets: tuple[BindingSettings, ...] = ()) -> Catalog:
    """Parse a stored revision; raise :class:`CatalogError` if it is not what ``digest`` says."""
    actual = content_digest(content.encode())
    if actual != digest:
        raise CatalogError(f"catalog revision {revision}",
                           f"stored content has digest {actual}, not {digest}")
    try:
        definitions, raw_bindings, object_bindings = parse_content_with_objects(content)
    except BadContent as exc:
        raise CatalogError(f"catalog revision {revision}", str(exc)) from None
    by_id = {b.binding_id: b for b in secrets}
    bindings = tuple(_binding(i, f, by_id) for i, f in enumerate(raw_bindings))
    # The digest is that of the stored bytes: a field added to the settings
    # later (with its default) does not change what an old revision was.
    return attrs.evolve(build_catalog(revision, definitions, bindings, object_bindings),
                        digest=digest, content=content)
