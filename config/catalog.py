"""The Catalog as integrationd serves it: L1 provider definitions + L2 bindings.

L1 definitions are data files (``config/providers/*.toml``); L2 bindings come
from the settings (``[[bindings]]``). :func:`load_catalog` validates both and
computes the ``BindingView`` digest: canonical JSON of every definition and
every binding's non-secret fields. A published revision stores that content
(``storage/catalog_revisions.py``) and is parsed back through the same
functions (:func:`build_catalog`), so work pinned to a revision runs against
exactly the definitions it was admitted under.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import attrs

from config.settings import BindingSettings, Settings
from daemon.core.canonical import NotCanonical
from daemon.core.catalog_content import content_bytes, content_digest
from daemon.core.effects import OperationContract

_METHODS = ("GET", "POST", "PATCH", "PUT", "DELETE")


class CatalogError(Exception):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


@attrs.frozen(kw_only=True)
class ReadDefinition:
    method: str
    path: str
    updated_at_field: str = ""


@attrs.frozen(kw_only=True)
class OperationDefinition:
    name: str
    provider: str
    intent_kinds: frozenset[str]
    local_object: str
    remote_object: str
    method: str
    path: str
    allowed_properties: frozenset[str]
    contract: OperationContract
    read: ReadDefinition | None = None


@attrs.frozen(kw_only=True)
class Catalog:
    revision: int
    digest: str
    operations: dict[str, OperationDefinition]
    bindings: tuple[BindingSettings, ...]
    # The canonical content (``daemon/core/catalog_content.py``) the digest is of.
    content: str = attrs.field(default="", repr=False)

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


def _req(key: str, table: dict[str, Any], name: str, kind: type[Any]) -> Any:
    value = table.get(name)
    if not isinstance(value, kind):
        raise CatalogError(f"{key}.{name}", f"expected {kind.__name__}")
    return value


def _operation(provider: str, name: str, table: dict[str, Any]) -> OperationDefinition:
    key = f"providers.{provider}.operations.{name}"
    method = _req(key, table, "method", str)
    if method not in _METHODS:
        raise CatalogError(f"{key}.method", f"expected one of {_METHODS}")
    path = _req(key, table, "path", str)
    if not path.startswith("/") or "{remote_id}" not in path:
        raise CatalogError(f"{key}.path", "expected a path starting with / naming {remote_id}")
    read = None
    if "read" in table:
        rt = table["read"]
        read = ReadDefinition(method=_req(f"{key}.read", rt, "method", str),
                              path=_req(f"{key}.read", rt, "path", str),
                              updated_at_field=str(rt.get("updated_at_field", "")))
    statuses = table.get("not_applied_statuses", [429])
    if not isinstance(statuses, list) or not all(isinstance(s, int) for s in statuses):
        raise CatalogError(f"{key}.not_applied_statuses", "expected a list of status codes")
    return OperationDefinition(
        name=name,
        provider=provider,
        intent_kinds=frozenset(_req(key, table, "intent_kinds", list)),
        local_object=_req(key, table, "local_object", str),
        remote_object=_req(key, table, "remote_object", str),
        method=method,
        path=path,
        allowed_properties=frozenset(_req(key, table, "allowed_properties", list)),
        contract=OperationContract(
            not_applied_statuses=frozenset(statuses),
            replay_safe=bool(table.get("replay_safe", False)),
            default_retry_after_s=float(table.get("default_retry_after", 5.0)),
            max_in_flight_s=float(table.get("max_in_flight", 30.0)),
            max_clock_skew_s=float(table.get("max_clock_skew", 2.0)),
        ),
        read=read,
    )


def load_documents(directory: str = "") -> list[Any]:
    """Every L1 definition document, by file name: the shipped ones
    (``config/providers/*.toml``), or those in ``directory`` (``catalog.definitions_dir``)."""
    documents: list[Any] = []
    folder: Traversable = (Path(directory) if directory
                           else resources.files("config").joinpath("providers"))
    if directory and not Path(directory).is_dir():
        raise CatalogError("catalog.definitions_dir", f"no such directory: {directory}")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".toml"):
            continue
        doc = tomllib.loads(entry.read_text())
        provider = doc.get("provider")
        if not isinstance(provider, str) or f"{provider}.toml" != entry.name:
            raise CatalogError(f"providers/{entry.name}", "provider must match the file name")
        documents.append(doc)
    return documents


def operations_from_documents(documents: list[Any]) -> dict[str, OperationDefinition]:
    """Parse L1 definition documents: the shipped files, or a stored revision's content."""
    operations: dict[str, OperationDefinition] = {}
    for i, doc in enumerate(documents):
        provider = doc.get("provider") if isinstance(doc, dict) else None
        if not isinstance(provider, str) or not provider:
            raise CatalogError(f"definitions[{i}].provider", "expected a provider name")
        for name, table in doc.get("operations", {}).items():
            if name in operations:
                raise CatalogError(f"providers.{provider}.operations.{name}", "duplicate")
            operations[name] = _operation(provider, name, table)
    return operations


def load_definitions(directory: str = "") -> tuple[dict[str, OperationDefinition], list[Any]]:
    """Every L1 definition (and the raw documents, for the digest)."""
    documents = load_documents(directory)
    return operations_from_documents(documents), documents


def binding_fields(binding: BindingSettings) -> dict[str, Any]:
    """An L2 binding's non-secret fields: what a Catalog revision holds of it."""
    return {k: v for k, v in attrs.asdict(binding).items() if k != "token"}


def build_catalog(revision: int, documents: list[Any],
                  bindings: tuple[BindingSettings, ...]) -> Catalog:
    """Validate L1 documents and L2 bindings into a :class:`Catalog` whose digest is
    that of their revision content (``daemon/core/catalog_content.py``)."""
    operations = operations_from_documents(documents)
    providers = {op.provider for op in operations.values()}
    for i, b in enumerate(bindings):
        if b.provider not in providers:
            raise CatalogError(f"bindings[{i}].provider",
                               f"no L1 definition for {b.provider!r}")
    try:
        content = content_bytes(documents, [binding_fields(b) for b in bindings])
    except NotCanonical as exc:
        raise CatalogError("catalog", f"cannot be stored canonically: {exc}") from None
    return Catalog(
        revision=revision,
        digest=content_digest(content),
        operations=operations,
        bindings=bindings,
        content=content.decode(),
    )


def load_catalog(settings: Settings) -> Catalog:
    """The Catalog this configuration describes (its L1 definition files + its L2
    bindings), numbered ``catalog.revision``. Whether that revision is *published* with
    this digest is for the caller to check (``daemon/services/catalog_view.py``)."""
    return build_catalog(settings.catalog.revision,
                         load_documents(settings.catalog.definitions_dir), settings.bindings)
