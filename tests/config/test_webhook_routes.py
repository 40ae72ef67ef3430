"""[ingress] and [[webhook_routes]] (L2) and [webhooks."<name>"] (L1): every bad value is one
error naming its key; secrets come from credentials, files or the environment only."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

import pytest

from config.definitions import CatalogError, parse_provider, parse_webhooks
from config.load import ConfigError, parse_settings
from daemon.services.families import known_family_names

PROVIDERS = Path(__file__).resolve().parents[2] / "config" / "providers"


def _raw(**route: Any) -> dict[str, Any]:
    return {
        "bindings": [{"binding_id": "o", "provider": "outreach", "org_id": "org",
                      "app_installation_id": "i", "remote_account_id": "a",
                      "base_url": "http://127.0.0.1:1"}],
        "webhook_routes": [{"route": "o-main", "binding_id": "o",
                            "webhook": "outreach.prospect_events", **route}],
    }


def _load(raw: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    return parse_settings(raw, environ=env or {}, known_families=known_family_names())


def test_a_route_with_two_active_secrets(tmp_path: Path) -> None:
    (tmp_path / "new").write_text("new-secret\n")
    cfg = _load(_raw(secret_file=str(tmp_path / "new")),
                {"INTEGRATIOND_WEBHOOK_O_MAIN_PREVIOUS_SECRET": "old-secret"})
    (route,) = cfg.webhook_routes
    assert route.secrets() == (b"new-secret", b"old-secret")
    assert "new-secret" not in repr(route)


def test_a_credential_wins_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "webhook-o-main-secret").write_text("from-credential")
    (route,) = _load(_raw(secret_file=str(tmp_path / "missing")),
                     {"CREDENTIALS_DIRECTORY": str(tmp_path)}).webhook_routes
    assert route.secrets() == (b"from-credential",)


@pytest.mark.parametrize(("route", "ingress", "key", "message"), [
    ({"secret": "inline"}, {}, "webhook_routes[0].secret", "secrets are not read"),
    ({"route": "Bad Name"}, {}, "webhook_routes[0].route", "expected 1-63"),
    ({"binding_id": "nope"}, {}, "webhook_routes[0].binding_id", "no [[bindings]]"),
    ({"webhook": "nope"}, {}, "webhook_routes[0].webhook", "no L1 webhook contract"),
    ({"webhook": "hubspot.contact_events"}, {}, "webhook_routes[0].webhook", "belongs to"),
    ({"subscription_generation": 0}, {}, "webhook_routes[0].subscription_generation",
     "must be positive"),
    ({"public_url": "ftp://x"}, {}, "webhook_routes[0].public_url", "http"),
    ({"secret_generation": 0}, {}, "webhook_routes[0].secret_generation", "must be positive"),
    ({"secret_generation": True}, {}, "webhook_routes[0].secret_generation",
     "expected an integer"),
    ({"subscription_generation": "1"}, {}, "webhook_routes[0].subscription_generation",
     "expected an integer"),
    ({}, {"request_deadline": 5.0, "db_deadline": 1.0}, "ingress.request_deadline",
     "not inside the 5 s response window"),
    ({}, {"request_deadline": 2.5, "db_deadline": 1.0}, "ingress.request_deadline",
     "twice 2.5 s (the body, then the receipt)"),
    ({}, {"db_deadline": 2.0}, "ingress.db_deadline", "must be shorter"),
    ({}, {"max_body_bytes": 0}, "ingress.max_body_bytes", "must be positive"),
    ({}, {"listen": "nowhere"}, "ingress.listen", "expected host:port"),
    ({}, {"spool_dir": ""}, "ingress.spool_dir", "must not be empty"),
    ({}, {"bogus": 1}, "ingress.bogus", "unknown setting"),
])
def test_bad_route_or_ingress_settings_name_the_key(route: dict[str, Any],
                                                     ingress: dict[str, Any], key: str,
                                                     message: str) -> None:
    raw = _raw(**route)
    if ingress:
        raw["ingress"] = ingress
    with pytest.raises(ConfigError, match="^" + key.replace("[", r"\[").replace("]", r"\]")
                       ) as caught:
        _load(raw)
    assert message in str(caught.value)


def test_duplicate_routes_are_refused() -> None:
    raw = _raw()
    raw["webhook_routes"].append(dict(raw["webhook_routes"][0]))
    with pytest.raises(ConfigError, match=r"webhook_routes\[1\].route: duplicate"):
        _load(raw)


OUTREACH = tomllib.loads((PROVIDERS / "outreach.toml").read_text())
NAME = "outreach.prospect_events"


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(OUTREACH)
    table = doc["webhooks"][NAME]
    for part in path[:-1]:
        table = table[part]
    if value is None:
        del table[path[-1]]
    else:
        table[path[-1]] = value
    return doc


@pytest.mark.parametrize(("path", "value", "key"), [
    (("redelivery",), "sometimes", "redelivery"),
    (("redelivery_attempts",), -1, "redelivery_attempts"),
    (("redelivery_attempts",), 1.5, "redelivery_attempts"),
    (("redelivery_attempts",), True, "redelivery_attempts"),
    (("redelivery_attempts",), 101, "redelivery_attempts"),
    (("redelivery_interval",), -1.0, "redelivery_interval"),
    (("redelivery_interval",), "1s", "redelivery_interval"),
    # Given together or not at all.
    (("redelivery_interval",), None, "redelivery_interval"),
    (("response_window",), 0, "response_window"),
    (("content_types",), ["not a type"], "content_types"),
    (("payload_version",), 0, "payload_version"),
    (("signature",), None, "signature"),
    (("bogus",), 1, "bogus"),
    (("signature", "header"), "Bad Header", "signature.header"),
    (("signature", "encoding"), "base32", "signature.encoding"),
    (("signature", "signed"), ["uri"], "signature.signed"),
    (("signature", "signed"), ["body", "timestamp"], "signature.timestamp_header"),
    (("payload", "event_name"), "meta.eventName", "payload.event_name"),
    (("payload", "events"), {}, "payload.events"),
    (("payload", "events"), {"prospect.merged": "merged"}, "payload.events.prospect.merged"),
    (("payload", "format"), "xml", "payload.format"),
    (("payload", "max_depth"), "deep", "payload.max_depth"),
    (("payload", "event_identity"), "/data/id", "payload.event_identity"),
    (("payload", "event_identity"), [], "payload.event_identity"),
    (("payload", "event_identity"), ["data/id"], "payload.event_identity"),
    (("payload", "event_identity"), [""], "payload.event_identity"),
    (("payload", "attempt_fields"), ["/meta/attempt"], "payload.attempt_fields"),
    (("payload", "attempt_fields"), [7], "payload.attempt_fields"),
    (("payload", "event_identiy"), ["/data/id"], "payload.event_identiy"),
])
def test_bad_l1_webhook_contracts_name_the_key(path: tuple[str, ...], value: Any,
                                               key: str) -> None:
    doc = _with(path, value)
    parse_provider(doc, "outreach.toml")  # the document's shape is fine
    with pytest.raises(CatalogError) as caught:
        parse_webhooks(doc)
    assert caught.value.key == f"providers.outreach.webhooks.{NAME}.{key}"


def test_stable_delivery_id_needs_its_header() -> None:
    doc = _with(("payload", "delivery_id_stable"), True)
    del doc["webhooks"][NAME]["payload"]["delivery_id_header"]
    with pytest.raises(CatalogError) as caught:
        parse_webhooks(doc)
    assert caught.value.key.endswith("payload.delivery_id_stable")


def test_the_redelivery_window_is_the_l1_schedule_or_none() -> None:
    (hook,) = parse_webhooks(OUTREACH).values()
    # 3 redeliveries 1 s apart, each attempt waiting the 5 s response window.
    assert (hook.redelivery_attempts, hook.redelivery_interval_s) == (3, 1.0)
    assert hook.redelivery_window_s() == 4 * 5.0 + 3 * 1.0
    doc = _with(("redelivery_attempts",), None)
    del doc["webhooks"][NAME]["redelivery_interval"]
    (undeclared,) = parse_webhooks(doc).values()
    assert undeclared.redelivery_window_s() is None  # no self-retirement without it
