"""The L1 ``[webhooks."<name>".subscription]`` section and the desired subscriptions it and
the L2 routes make (pure, table-driven; every bad input names its key)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from config.catalog import load_definitions
from config.definitions import CatalogError, parse_webhooks
from config.settings import Secret, WebhookRoute
from config.subscription_defs import desired_subscriptions

HOOK = "outreach.prospect_events"
SUB = f"providers.outreach.webhooks.{HOOK}.subscription"


def _outreach() -> dict[str, Any]:
    _, documents = load_definitions()
    (doc,) = [d for d in documents if d["provider"] == "outreach"]
    return copy.deepcopy(doc)


def test_the_shipped_outreach_contract_declares_its_subscription() -> None:
    sub = parse_webhooks(_outreach())[HOOK].subscription
    assert sub is not None
    assert (sub.resource, sub.actions, sub.auth_header, sub.auth_prefix) == (
        "prospect", ("created", "updated", "destroyed"), "Authorization", "Bearer ")
    body = sub.create.body.render_values({"$resource": "prospect", "$action": "updated",
                                          "$url": "https://x/hooks/r", "$secret": "s",
                                          "$payload_version": 2})
    assert body == {"data": {"type": "webhook", "attributes": {
        "resource": "prospect", "action": "updated", "url": "https://x/hooks/r",
        "secret": "s", "payloadVersion": 2}}}
    assert sub.delete.path.render(remote_id="17") == "/api/v2/webhooks/17"
    assert sub.delete.cleanup_header == "Outreach-Cleanup-Token"
    assert (sub.max_in_flight_s, sub.max_clock_skew_s) == (30.0, 2.0)


def _drop(*path: str) -> Any:
    def change(sub: dict[str, Any]) -> None:
        target = sub
        for p in path[:-1]:
            target = target[p]
        del target[path[-1]]
    return change


def _set(value: Any, *path: str) -> Any:
    def change(sub: dict[str, Any]) -> None:
        target = sub
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
    return change


@pytest.mark.parametrize(("change", "key", "message"), [
    (_drop("resource"), f"{SUB}.resource", "missing"),
    (_set([], "actions"), f"{SUB}.actions", "expected at least one entry"),
    (_set("oauth", "auth"), f"{SUB}.auth", "no auth scheme 'oauth'"),
    (_set(1, "extra"), f"{SUB}.extra", "unknown key"),
    (_drop("create", "id"), f"{SUB}.create.id", "missing"),
    (_set({"data": "$token"}, "create", "body"), f"{SUB}.create.body.data",
     "unknown placeholder '$token'"),
    (_set("api/v2/webhooks", "create", "path"), f"{SUB}.create.path", "expected a path"),
    (_set("FETCH", "list", "method"), f"{SUB}.list.method", "expected one of"),
    (_drop("list", "item_url"), f"{SUB}.list.item_url", "missing"),
    (_set("/api/v2/webhooks", "delete", "path"), f"{SUB}.delete.path",
     "must name the subscription"),
    (_set([99], "delete", "absent_statuses"), f"{SUB}.delete.absent_statuses",
     "expected a list of HTTP status codes"),
    (_set(7, "delete", "cleanup_header"), f"{SUB}.delete.cleanup_header",
     "expected an HTTP header name"),
    (_set(-1, "max_in_flight"), f"{SUB}.max_in_flight", "expected a non-negative number"),
    (_set("30s", "max_clock_skew"), f"{SUB}.max_clock_skew",
     "expected a non-negative number"),
])
def test_a_bad_subscription_section_names_its_key(change: Any, key: str,
                                                  message: str) -> None:
    doc = _outreach()
    change(doc["webhooks"][HOOK]["subscription"])
    with pytest.raises(CatalogError) as caught:
        parse_webhooks(doc)
    assert caught.value.key == key
    assert message in str(caught.value)


def _route(**kw: Any) -> WebhookRoute:
    base: dict[str, Any] = {"route": "r1", "binding_id": "b1", "webhook": HOOK,
                            "public_url": "https://hooks.example/hooks/r1",
                            "secret": Secret("s")}
    return WebhookRoute(**{**base, **kw})


@pytest.mark.parametrize(("routes", "names"), [
    ((_route(),), ["r1:created", "r1:destroyed", "r1:updated"]),
    ((_route(public_url=""),), []),  # no public URL: an operator subscribes it
    ((_route(webhook="hubspot.contact_events"),), []),  # no subscription section
    ((_route(webhook="nope"),), []),
    ((_route(), _route(route="r2", binding_id="b2")),
     ["r1:created", "r1:destroyed", "r1:updated", "r2:created", "r2:destroyed",
      "r2:updated"]),
])
def test_desired_subscriptions_per_route_and_action(routes: tuple[WebhookRoute, ...],
                                                    names: list[str]) -> None:
    _, documents = load_definitions()
    webhooks = {n: w for d in documents for n, w in parse_webhooks(d).items()}
    desired = desired_subscriptions(webhooks, routes)
    assert [d.name for d in desired] == names
    for d in desired:
        assert (d.resource, d.payload_version, d.secret_generation) == ("prospect", 2, 1)


def test_the_secret_generation_comes_from_the_route() -> None:
    _, documents = load_definitions()
    webhooks = {n: w for d in documents for n, w in parse_webhooks(d).items()}
    (first, *_) = desired_subscriptions(webhooks, (_route(secret_generation=3),))
    assert first.secret_generation == 3 and first.url == "https://hooks.example/hooks/r1"
