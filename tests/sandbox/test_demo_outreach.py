"""Where ``python -m sandbox`` places the Outreach simulator, and the clear errors when
the configuration cannot place it (each names the key; no secret in the message)."""

from __future__ import annotations

from typing import Any

import pytest

from config.load import parse_settings
from config.settings import Settings
from daemon.services.families import known_family_names
from sandbox.demo import SandboxConfigError, _outreach_pieces

SECRET_ENV = "INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET"
TOKEN_ENV = "INTEGRATIOND_BINDING_OUTREACH_MAIN_TOKEN"
ENV = {SECRET_ENV: "whsec-1", TOKEN_ENV: "token-1"}
# A binding that authenticates by its grant has no static token for the simulator.
GRANT = {"auth": "grant", "token_url": "http://127.0.0.1:1/token", "client_id": "c"}


def _settings(*, binding: dict[str, Any] | None = None, route: dict[str, Any] | None = None,
              listen: str = "127.0.0.1:8782", env: dict[str, str] | None = None,
              provider: str = "outreach") -> Settings:
    raw: dict[str, Any] = {
        "keys": {"active": "k1"},
        "ingress": {"listen": listen},
        "bindings": [{"binding_id": "outreach-main", "provider": provider, "org_id": "o",
                      "app_installation_id": "i", "remote_account_id": "a",
                      "base_url": "http://127.0.0.1:8793", "auth": "static_token",
                      **(binding or {})}],
        "webhook_routes": [{"route": "outreach-main", "binding_id": "outreach-main",
                            "webhook": "outreach.prospect_events" if provider == "outreach"
                            else "hubspot.contact_events", **(route or {})}],
    }
    return parse_settings(raw, environ=ENV if env is None else env,
                          known_families=known_family_names())


def test_the_route_url_is_public_url_else_the_ingress_listener() -> None:
    pieces = _outreach_pieces(_settings())
    assert pieces is not None
    assert pieces.hooks_url == "http://127.0.0.1:8782/hooks/outreach-main"
    assert pieces.binding.binding_id == "outreach-main"
    assert pieces.route.route == "outreach-main"
    public = _outreach_pieces(_settings(route={"public_url": "http://hooks.test/h/o"}))
    assert public is not None and public.hooks_url == "http://hooks.test/h/o"


def test_no_outreach_binding_means_no_outreach_simulator() -> None:
    assert _outreach_pieces(_settings(provider="hubspot")) is None


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"binding": GRANT, "env": {SECRET_ENV: "whsec-1",
                                "INTEGRATIOND_BINDING_OUTREACH_MAIN_CLIENT_SECRET": "cs-1"}},
     "bindings.outreach-main.token"),
    ({"env": {TOKEN_ENV: "token-1"}}, "webhook_routes.outreach-main.secret"),
    ({"listen": "127.0.0.1:0"}, "webhook_routes.outreach-main.public_url"),
    ({"listen": ""}, "webhook_routes.outreach-main.public_url"),
])
def test_what_cannot_be_placed_is_a_config_error_naming_the_key(
        kwargs: dict[str, Any], key: str) -> None:
    settings = _settings(**kwargs)  # the loader accepts each: only the sandbox needs more
    with pytest.raises(SandboxConfigError) as raised:
        _outreach_pieces(settings)
    assert raised.value.key == key
    assert str(raised.value).startswith(f"{key}: ")
    for secret in ("whsec-1", "token-1", "cs-1"):
        assert secret not in str(raised.value)


def test_an_s2s_binding_needs_no_static_token_and_the_simulator_knows_its_app(
        tmp_path: Any) -> None:
    from sandbox.demo import _outreach_simulator
    from sandbox.demo_keys import private_pem

    (tmp_path / "app.pem").write_bytes(private_pem())
    s2s = {"auth": "s2s", "s2s_app_id": "app-9", "s2s_installation_id": "inst-9",
           "token_url": "http://127.0.0.1:8793/api/app/installs/{installation_id}/actions/"
                        "accessToken", "s2s_private_key_file": str(tmp_path / "app.pem")}
    pieces = _outreach_pieces(_settings(binding=s2s, env={SECRET_ENV: "whsec-1"}))
    assert pieces is not None and pieces.binding.auth == "s2s"
    osim, own = _outreach_simulator(pieces.binding)
    assert osim.tokens == {own}  # only the sandbox's own token until something is minted
    (mount,) = osim.mounts
    endpoint = mount[2].__self__  # type: ignore[attr-defined]
    assert (endpoint.app_id, endpoint.installs) == ("app-9", {"inst-9"})
