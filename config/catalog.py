"""The Catalog as integrationd serves it: L1 provider definitions + L2 bindings.

L1 definitions are data files (``config/providers/*.toml``, or the directory named
by ``[catalog] definitions_dir``), each parsed by the pure
:func:`config.definitions.parse_provider`; L2 bindings come from the settings
(``[[bindings]]``). :func:`load_catalog` validates both and computes the
``BindingView`` digest: canonical JSON of every definition and every binding's
non-secret fields. A published revision stores that content
(``storage/catalog_revisions.py``) and is parsed back through the same functions
(:func:`build_catalog`), so work pinned to a revision runs against exactly the
definitions it was admitted under.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import attrs

from config.definitions import (
    CatalogError,
    ObjectBinding,
    OperationDefinition,
    ResourceDefinition,
    WebhookDefinition,
    parse_object_binding,
    parse_provider,
    parse_resources,
    parse_webhooks,
)
from config.settings import BindingSettings, Settings
from daemon.core.canonical import NotCanonical
from daemon.core.catalog_content import content_bytes, content_digest

__all__ = ["Catalog", "CatalogError", "OperationDefinition", "build_catalog", "load_catalog",
           "load_definitions", "load_documents", "load_object_binding_documents"]


@attrs.frozen(kw_only=True)
class Catalog:
    revision: int
    digest: str
    operations: dict[str, OperationDefinition]
    bindings: tuple[BindingSettings, ...]
    # The canonical content (``daemon/core/catalog_content.py``) the digest is of.
    content: str = attrs.field(default="", repr=False)
    # L1 resources by "<provider>.<resource>", and the L2 object bindings on them.
    resources: dict[str, ResourceDefinition] = attrs.field(factory=dict)
    object_bindings: tuple[ObjectBinding, ...] = ()

    def resource(self, provider: str, name: str) -> ResourceDefinition | None:
        return self.resources.get(f"{provider}.{name}")

    def object_binding(self, name: str) -> ObjectBinding | None:
        for o in self.object_bindings:
            if o.name == name:
                return o
        return None
    # L1 webhook route contracts by name (``[webhooks."<name>"]``).
    webhooks: dict[str, WebhookDefinition] = attrs.field(factory=dict)

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


def load_documents(directory: str | Path | Traversable = "") -> list[Any]:
    """Every L1 definition document, by file name: the shipped ones
    (``config/providers/*.toml``), or those in ``directory`` (``catalog.definitions_dir``).
    Each is validated as it is read (a bad file is one error naming its key)."""
    # parse_provider: the file name must match; errors name the key.
    return _toml_folder(directory, "catalog.definitions_dir", "providers", parse_provider)


def operations_from_documents(documents: list[Any]) -> dict[str, OperationDefinition]:
    """Parse L1 definition documents: the shipped files, or a stored revision's content."""
    operations: dict[str, OperationDefinition] = {}
    for i, doc in enumerate(documents):
        if not isinstance(doc, dict):
            raise CatalogError(f"definitions[{i}]", "expected a provider document")
        for name, operation in parse_provider(doc).items():
            if name in operations:
                raise CatalogError(f"providers.{operation.provider}.operations.{name}",
                                   "duplicate operation name")
            operations[name] = operation
    return operations


def resources_from_documents(documents: list[Any]) -> dict[str, ResourceDefinition]:
    """Every L1 resource of these (valid) documents, keyed ``<provider>.<resource>``."""
    out: dict[str, ResourceDefinition] = {}
    for doc in documents:
        for name, resource in parse_resources(doc).items():
            out[f"{resource.provider}.{name}"] = resource
    return out


def load_object_binding_documents(directory: str | Path | Traversable = "") -> list[Any]:
    """Every L2 object-binding document: the shipped ones (``config/bindings/*.toml``) or
    those in ``directory`` (``catalog.object_bindings_dir``). Each is parsed as it is read
    (name and file agree); its fields are checked against L1 in :func:`build_catalog`."""
    return _toml_folder(directory, "catalog.object_bindings_dir", "bindings",
                        parse_object_binding)


def _toml_folder(directory: str | Path | Traversable, key: str, shipped: str,
                 check: Callable[[Any, str], object]) -> list[Any]:
    """The ``*.toml`` documents of ``directory`` (or the shipped ``config/<shipped>/``), by
    file name, each passed to ``check`` with its file name as it is read."""
    folder: Traversable | Path
    if isinstance(directory, str):
        if directory and not Path(directory).is_dir():
            raise CatalogError(key, f"no such directory: {directory}")
        folder = (Path(directory) if directory
                  else resources.files("config").joinpath(shipped))
    else:
        folder = directory
    try:
        entries = sorted(folder.iterdir(), key=lambda e: e.name)
    except OSError as exc:
        raise CatalogError(key, f"cannot read {folder}: {exc.strerror}") from None
    documents: list[Any] = []
    for entry in entries:
        if not entry.name.endswith(".toml"):
            continue
        try:
            doc = tomllib.loads(entry.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise CatalogError(f"{shipped}/{entry.name}", f"not valid TOML: {exc}") from None
        check(doc, entry.name)
        documents.append(doc)
    return documents


def webhooks_from_documents(documents: list[Any]) -> dict[str, WebhookDefinition]:
    """Every L1 webhook route contract of these documents (names are unique)."""
    webhooks: dict[str, WebhookDefinition] = {}
    for doc in documents:
        for name, webhook in parse_webhooks(doc).items():
            if name in webhooks:
                raise CatalogError(f"providers.{webhook.provider}.webhooks.{name}",
                                   "duplicate webhook name")
            webhooks[name] = webhook
    return webhooks


def load_definitions(directory: str | Path | Traversable = ""
                     ) -> tuple[dict[str, OperationDefinition], list[Any]]:
    """Every L1 definition (and the raw documents, for the digest)."""
    documents = load_documents(directory)
    return operations_from_documents(documents), documents


# Not Catalog facts: the token is a secret, the generation belongs to the principal
# binding (seed 8.1: a reconnect moves it; it must not need a new Catalog revision), and
# so does how it authenticates (a move from a static token to a grant, or a new OAuth
# client, changes no definition; nor does an S2S app's id, installation or key).
PRINCIPAL_FIELDS = frozenset({"token", "generation", "auth", "token_url", "client_id",
                              "client_secret", "s2s_app_id", "s2s_installation_id",
                              "s2s_private_key"})


def binding_fields(binding: BindingSettings) -> dict[str, Any]:
    """An L2 binding's Catalog fields: what a Catalog revision holds of it."""
    fields = {k: v for k, v in attrs.asdict(binding).items() if k not in PRINCIPAL_FIELDS}
    if not binding.quota:
        # A binding without quota scope overrides keeps the content (and digest) it had.
        del fields["quota"]
    for q in fields.get("quota", ()):
        if not q["endpoint_classes"]:
            del q["endpoint_classes"]  # likewise an override without endpoint classes
    return fields


def build_catalog(revision: int, documents: list[Any],
                  bindings: tuple[BindingSettings, ...],
                  object_binding_documents: list[Any] | None = None) -> Catalog:
    """Validate L1 documents, L2 bindings and L2 object bindings into a :class:`Catalog`
    whose digest is that of their revision content (``daemon/core/catalog_content.py``)."""
    operations = operations_from_documents(documents)
    resources_ = resources_from_documents(documents)
    object_bindings: list[ObjectBinding] = []
    for i, doc in enumerate(object_binding_documents or []):
        if not isinstance(doc, dict):
            raise CatalogError(f"object_bindings[{i}]", "expected an object binding document")
        parsed = parse_object_binding(doc, resources=resources_, operations=operations)
        if any(o.name == parsed.name for o in object_bindings):
            raise CatalogError(f"object_bindings.{parsed.name}", "duplicate object binding")
        object_bindings.append(parsed)
    providers = {op.provider for op in operations.values()}
    for i, b in enumerate(bindings):
        if b.provider not in providers:
            raise CatalogError(f"bindings[{i}].provider",
                               f"no L1 definition for {b.provider!r}")
    try:
        content = content_bytes(documents, [binding_fields(b) for b in bindings],
                                list(object_binding_documents or []))
    except NotCanonical as exc:
        raise CatalogError("catalog", f"cannot be stored canonically: {exc}") from None
    return Catalog(
        revision=revision,
        digest=content_digest(content),
        operations=operations,
        bindings=bindings,
        content=content.decode(),
        resources=resources_,
        object_bindings=tuple(object_bindings),
        webhooks=webhooks_from_documents(documents),
    )


def load_catalog(settings: Settings) -> Catalog:
    """The Catalog this configuration describes (its L1 definition files + its L2
    bindings), numbered ``catalog.revision``. Whether that revision is *published* with
    this digest is for the caller to check (``daemon/services/catalog_view.py``)."""
    return build_catalog(settings.catalog.revision,
                         load_documents(settings.catalog.definitions_dir), settings.bindings,
                         load_object_binding_documents(settings.catalog.object_bindings_dir))
