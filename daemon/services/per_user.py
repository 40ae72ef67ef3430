"""Which L2 binding a command runs under, per-user principals included (seed 8).

A shared principal is a Catalog binding (``[[bindings]]``): the command names it. A
per-user principal is a durable PrincipalBinding that no Catalog revision lists (the
Runtime connects it through ``/v1/bindings/...``): its endpoint and auth settings are
those of the Catalog's binding for the same org, app installation and provider, and its
token is that user's grant, under the user's binding id and pinned generation. Only a
binding that authenticates with grants (``auth = "grant"``) can carry per-user
principals: a static token is nobody's in particular, so such a command has no binding
and fails closed.
"""

from __future__ import annotations

import attrs

from config.catalog import Catalog, OperationDefinition
from config.settings import BindingSettings
from storage.effect_values import Command


def command_binding(catalog: Catalog, command: Command,
                    op: OperationDefinition | None) -> BindingSettings | None:
    """The binding ``command`` runs under in ``catalog`` (None: none; fail closed)."""
    own = catalog.binding(command.binding_id)
    if own is not None or op is None:
        return own
    shared = catalog.binding_for(command.scope.org_id, command.scope.app_installation_id,
                                 op.provider)
    if shared is None or shared.auth != "grant":
        return None
    return attrs.evolve(shared, binding_id=command.binding_id)
