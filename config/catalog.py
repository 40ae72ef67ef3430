"""The Catalog as integrationd serves it: L1 provider definitions + L2 bindings.

L1 definitions are data files (``config/providers/*.toml``, or the folder named
by ``[catalog] providers_dir``), each parsed by the pure
:func:`config.definitions.parse_provider`; L2 bindings come from the settings
(``[[bindings]]``). :func:`load_catalog` validates both and
computes the ``BindingView`` digest: canonical JSON of every definition and
every binding's non-secret fields, so a command pinned to a revision can be
checked against exactly what is being served.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import attrs

from config.definitions import CatalogError, OperationDefinition, parse_provider
from config.settings import BindingSettings, Settings
from daemon.core.canonical import canonical_digest

__all__ = ["Catalog", "CatalogError", "OperationDefinition", "load_catalog", "load_definitions"]


@attrs.frozen(kw_only=True)
class Catalog:
    revision: int
    digest: str
    operations: dict[str, OperationDefinition]
    bindings: tuple[BindingSettings, ...]

    def operation(self, name: str) -> OperationDefinition | None:
        return self.operations.get(name)

    def binding_for(self, org_id: str, app_installation_id: str,
                    provider: str) -> BindingSettings | None:
        for b in self.bindings:
            if (b.org_id, b.app_installation_id, b.provider) == (
                org_id, app_installation_id, provider):
                return b
        return None

    def binding(self, binding_id: str) -> BindingSettings | None:
        for b in self.bindings:
            if b.binding_id == binding_id:
                return b
        return None


def load_definitions(folder: Traversable | Path | None = None
                     ) -> tuple[dict[str, OperationDefinition], list[Any]]:
    """Every L1 definition in ``folder`` (default: the shipped ones), and the raw
    documents, for the digest."""
    operations: dict[str, OperationDefinition] = {}
    documents: list[Any] = []
    if folder is None:
        folder = resources.files("config").joinpath("providers")
    try:
        entries = sorted(folder.iterdir(), key=lambda e: e.name)
    except OSError as exc:
        raise CatalogError("catalog.providers_dir", f"cannot read {folder}: {exc.strerror}"
                           ) from None
    for entry in entries:
        if not entry.name.endswith(".toml"):
            continue
        try:
            doc = tomllib.loads(entry.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise CatalogError(f"providers/{entry.name}", f"not valid TOML: {exc}") from None
        documents.append(doc)
        for name, operation in parse_provider(doc, entry.name).items():
            if name in operations:
                raise CatalogError(f"providers.{operation.provider}.operations.{name}",
                                   "duplicate operation name")
            operations[name] = operation
    return operations, documents


def load_catalog(settings: Settings) -> Catalog:
    folder = (Path(settings.base_dir) / settings.catalog.providers_dir
              if settings.catalog.providers_dir else None)
    operations, documents = load_definitions(folder)
    providers = {op.provider for op in operations.values()}
    for i, b in enumerate(settings.bindings):
        if b.provider not in providers:
            raise CatalogError(f"bindings[{i}].provider",
                               f"no L1 definition for {b.provider!r}")
    view = {
        "revision": settings.catalog.revision,
        "definitions": documents,
        "bindings": [
            {k: v for k, v in attrs.asdict(b).items() if k != "token"} for b in settings.bindings
        ],
    }
    return Catalog(
        revision=settings.catalog.revision,
        digest=canonical_digest(_no_floats(view)),
        operations=operations,
        bindings=settings.bindings,
    )


def _no_floats(value: Any) -> Any:
    """Canonical JSON has no floats; render them as decimal strings for the digest."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {k: _no_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_floats(v) for v in value]
    return value
