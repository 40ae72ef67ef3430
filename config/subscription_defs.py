"""L1 webhook subscription definitions: how integrationd asks a provider to call a route.

``[webhooks."<name>".subscription]`` in a provider document (seed 9: L1/Catalog owns the
desired subscription definition). Pure data, interpreted by the provider-neutral
subscription reconciler (``daemon/services/subscriptions.py``)::

    resource = "prospect"                 # the provider's resource name
    actions = ["created", "updated"]      # one subscription per action
    auth = "s2s"                          # the definition's auth scheme
    content_type = "application/vnd.api+json"
    max_in_flight = 30.0                  # s: the provider applies or drops a request
                                          # within this window (an unknown create is read
                                          # back only after it; default 30)
    max_clock_skew = 2.0                  # s, beside it (default 2)
    [create]   method, path, body (placeholders $resource $action $url $secret
               $payload_version), id (pointer), cleanup_token (pointer, optional)
    [list]     method, path, items, item_id, item_resource, item_action, item_url,
               item_payload_version, item_active (pointers)
    [delete]   method, path (with {remote_id}), absent_statuses, cleanup_header (optional:
               the header that carries a subscription's cleanup token when no token is)

A subscription's secret is never in these data: it is the L2 route's (``[[webhook_routes]]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from daemon.providers.template import BodyTemplate, PathTemplate, Pointer

CREATE_PLACEHOLDERS: Final = frozenset({"$resource", "$action", "$url", "$secret",
                                        "$payload_version"})
_KEYS: Final = frozenset({"resource", "actions", "auth", "content_type", "max_in_flight",
                          "max_clock_skew", "create", "list", "delete"})
_CREATE_KEYS: Final = frozenset({"method", "path", "body", "id", "cleanup_token"})
_LIST_KEYS: Final = frozenset({"method", "path", "items", "item_id", "item_resource",
                               "item_action", "item_url", "item_payload_version",
                               "item_active"})
_DELETE_KEYS: Final = frozenset({"method", "path", "absent_statuses", "cleanup_header"})


@attrs.frozen(kw_only=True)
class SubscriptionCreate:
    method: str
    path: PathTemplate
    body: BodyTemplate
    id: Pointer
    cleanup_token: Pointer | None


@attrs.frozen(kw_only=True)
class SubscriptionList:
    method: str
    path: PathTemplate
    items: Pointer
    item_id: Pointer
    item_resource: Pointer
    item_action: Pointer
    item_url: Pointer
    item_payload_version: Pointer
    item_active: Pointer


@attrs.frozen(kw_only=True)
class SubscriptionDelete:
    method: str
    path: PathTemplate
    absent_statuses: frozenset[int]
    cleanup_header: str


@attrs.frozen(kw_only=True)
class SubscriptionDefinition:
    resource: str
    actions: tuple[str, ...]
    auth_header: str
    auth_prefix: str
    content_type: str
    create: SubscriptionCreate
    list: SubscriptionList
    delete: SubscriptionDelete
    # The provider's in-flight window and clock skew (seconds): a create or delete whose
    # outcome is unknown is reconciled by listing only once this long has passed since
    # the client gave up on it (L2's binding may lengthen it, never shorten it).
    max_in_flight_s: float = 30.0
    max_clock_skew_s: float = 2.0


def parse_subscription(key: str, raw: Any, auth: Mapping[str, Any]) -> SubscriptionDefinition:
    """Validate one ``subscription`` table (``auth``: the document's auth schemes by name,
    each with ``header`` and ``prefix``). Raises ``CatalogError`` naming the key."""
    from config.definitions import (
        CatalogError,
        _compiled,
        _method,
        _number,
        _pointer,
        _req,
        _statuses,
        _strings,
        _table,
    )

    table = _table(key, raw, _KEYS)
    scheme_name = _req(key, table, "auth", str)
    scheme = auth.get(scheme_name)
    if scheme is None:
        raise CatalogError(f"{key}.auth", f"no auth scheme {scheme_name!r} in this definition")

    def ptr(k: str, t: Mapping[str, Any], name: str) -> Pointer:
        found = _pointer(k, t, name, required=True)
        assert found is not None
        return found

    def path(k: str, t: Mapping[str, Any], names: frozenset[str]) -> PathTemplate:
        return _compiled(f"{k}.path",  # type: ignore[no-any-return]
                         lambda v: PathTemplate.compile(v, names), _req(k, t, "path", str))

    ck = f"{key}.create"
    c = _table(ck, table.get("create"), _CREATE_KEYS)
    create = SubscriptionCreate(
        method=_method(ck, c), path=path(ck, c, frozenset()),
        body=_compiled(f"{ck}.body", lambda v: BodyTemplate.compile(v, CREATE_PLACEHOLDERS),
                       _req(ck, c, "body", dict)),
        id=ptr(ck, c, "id"), cleanup_token=_pointer(ck, c, "cleanup_token", required=False))
    lk = f"{key}.list"
    li = _table(lk, table.get("list"), _LIST_KEYS)
    listing = SubscriptionList(
        method=_method(lk, li), path=path(lk, li, frozenset()),
        **{name: ptr(lk, li, name) for name in sorted(_LIST_KEYS - {"method", "path"})})
    dk = f"{key}.delete"
    d = _table(dk, table.get("delete"), _DELETE_KEYS)
    header = d.get("cleanup_header", "")
    if not isinstance(header, str):
        raise CatalogError(f"{dk}.cleanup_header", "expected an HTTP header name")
    delete = SubscriptionDelete(
        method=_method(dk, d), path=path(dk, d, frozenset({"remote_id"})),
        absent_statuses=_statuses(f"{dk}.absent_statuses", d.get("absent_statuses", [404])),
        cleanup_header=header)
    if "{remote_id}" not in delete.path.text:
        raise CatalogError(f"{dk}.path", "must name the subscription: {remote_id}")
    return SubscriptionDefinition(
        resource=_req(key, table, "resource", str),
        actions=_strings(f"{key}.actions", _req(key, table, "actions", list)),
        auth_header=str(scheme.header), auth_prefix=str(scheme.prefix),
        content_type=_req(key, table, "content_type", str),
        create=create, list=listing, delete=delete,
        max_in_flight_s=_number(key, table, "max_in_flight", 30.0),
        max_clock_skew_s=_number(key, table, "max_clock_skew", 2.0))


@attrs.frozen(kw_only=True)
class DesiredSubscription:
    """One webhook subscription the Catalog and an L2 route want (data)."""

    name: str            # "<route>:<action>": unique, stable across reconciliations
    binding_id: str
    route: str
    webhook: str
    resource: str
    action: str
    url: str
    payload_version: int
    secret_generation: int


def desired_subscriptions(webhooks: Mapping[str, Any], routes: Any
                          ) -> tuple[DesiredSubscription, ...]:
    """Every subscription the routes want: each ``[[webhook_routes]]`` entry with a
    ``public_url`` whose L1 webhook contract declares a ``subscription`` gets one per
    declared action (a route without a public URL is subscribed by an operator)."""
    out: list[DesiredSubscription] = []
    for route in routes:
        webhook = webhooks.get(route.webhook)
        sub = getattr(webhook, "subscription", None)
        if webhook is None or sub is None or not route.public_url:
            continue
        for action in sub.actions:
            out.append(DesiredSubscription(
                name=f"{route.route}:{action}", binding_id=route.binding_id,
                route=route.route, webhook=route.webhook, resource=sub.resource,
                action=action, url=route.public_url,
                payload_version=webhook.payload_version,
                secret_generation=route.secret_generation))
    return tuple(sorted(out, key=lambda d: d.name))
