"""``auth = "s2s"`` in ``[[bindings]]`` (issue 10 item 7 with issue 9's S2S mint).

The app's S2S id, its installation and the mint URL are L2 settings; the RSA private key
comes from a file or a systemd credential, never the TOML. A key that cannot sign an
RS256 app JWT stops the start: one line naming the key, exit 2, never the key's text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.load import ConfigError, parse_settings
from config.settings import FAMILY_DEFAULTS, Settings
from daemon.cli import EXIT_USAGE
from daemon.services.principal_bootstrap import bootstrap_facts
from tests.support.processes import run_cli
from tests.support.s2s import ec_private_pem, private_pem

KEY = "bindings[0].s2s_private_key_file"


def _binding(key_file: Path | str, **extra: Any) -> dict[str, Any]:
    return {"binding_id": "outreach-main", "provider": "outreach", "org_id": "o",
            "app_installation_id": "i", "remote_account_id": "r",
            "base_url": "http://127.0.0.1:1", "auth": "s2s", "s2s_app_id": "app-1",
            "s2s_installation_id": "install-7",
            "token_url": "http://127.0.0.1:1/api/app/installs/{installation_id}/actions/"
                         "accessToken",
            "s2s_private_key_file": str(key_file), **extra}


def _parse(binding: dict[str, Any], environ: dict[str, str] | None = None) -> Settings:
    return parse_settings({"bindings": [binding]}, environ=environ or {},
                          known_families=tuple(FAMILY_DEFAULTS))


def test_an_s2s_binding_loads_its_key_from_a_file_and_bootstraps_its_installation(
        tmp_path: Path) -> None:
    (tmp_path / "app.pem").write_bytes(private_pem())
    (b,) = _parse(_binding(tmp_path / "app.pem")).bindings
    assert (b.auth, b.s2s_app_id, b.s2s_installation_id) == ("s2s", "app-1", "install-7")
    assert b.s2s_private_key is not None and b.s2s_private_key.reveal().startswith("-----")
    assert "PRIVATE KEY" not in repr(b)
    # The durable binding starts at this installation; from then on the row decides.
    assert bootstrap_facts(b).identity.installation_id == "install-7"


def test_an_s2s_key_comes_from_a_systemd_credential(tmp_path: Path) -> None:
    (tmp_path / "binding-outreach-main-s2s-key").write_bytes(private_pem())
    binding = _binding("")
    del binding["s2s_private_key_file"]
    (b,) = _parse(binding, {"CREDENTIALS_DIRECTORY": str(tmp_path)}).bindings
    assert b.s2s_private_key is not None


@pytest.mark.parametrize(("case", "says"), [
    ("missing", f"{KEY}: cannot read secret file"),
    ("directory", f"{KEY}: cannot read secret file"),
    ("not_pem", f"{KEY}: is not an unencrypted PEM private key"),
    ("not_rsa", f"{KEY}: is not an RSA private key"),
    ("none", f"{KEY}: auth = \"s2s\" needs the app's RSA private key"),
    ("inline", "bindings[0].s2s_private_key: secrets are not read from the config file"),
    ("no_app", "bindings[0].s2s_app_id: auth = \"s2s\" needs it"),
    ("no_install", "bindings[0].s2s_installation_id: auth = \"s2s\" needs it"),
    ("no_url", "bindings[0].token_url: auth = \"s2s\" needs the mint endpoint"),
    ("grant_with_key", f"{KEY}: auth = \"grant\" does not use an S2S private key"),
])
def test_a_bad_s2s_binding_is_one_line_naming_the_key(tmp_path: Path, case: str,
                                                      says: str) -> None:
    good = tmp_path / "app.pem"
    good.write_bytes(private_pem())
    binding = _binding(good)
    if case == "missing":
        binding = _binding(tmp_path / "absent.pem")
    elif case == "directory":
        binding = _binding(tmp_path)
    elif case == "not_pem":
        (tmp_path / "junk.pem").write_text("-----BEGIN PRIVATE KEY-----\nnot-a-key-SECRET\n")
        binding = _binding(tmp_path / "junk.pem")
    elif case == "not_rsa":
        (tmp_path / "ec.pem").write_bytes(ec_private_pem())
        binding = _binding(tmp_path / "ec.pem")
    elif case == "none":
        del binding["s2s_private_key_file"]
    elif case == "inline":
        binding["s2s_private_key"] = "-----BEGIN PRIVATE KEY-----"
    elif case == "no_app":
        binding["s2s_app_id"] = ""
    elif case == "no_install":
        del binding["s2s_installation_id"]
    elif case == "no_url":
        del binding["token_url"]
    elif case == "grant_with_key":
        binding.update(auth="grant", token_url="https://example.test/token", client_id="c")
    with pytest.raises(ConfigError) as info:
        _parse(binding, {"INTEGRATIOND_BINDING_OUTREACH_MAIN_CLIENT_SECRET": "c-SECRET"})
    assert str(info.value).startswith(says)
    assert "SECRET" not in str(info.value) and "\n" not in str(info.value)


def test_check_config_exits_2_with_one_line_for_a_key_that_is_not_rsa(tmp_path: Path) -> None:
    (tmp_path / "ec.pem").write_bytes(ec_private_pem())
    cfg = tmp_path / "integrationd.toml"
    lines = ["[[bindings]]"]
    for name, value in _binding(tmp_path / "ec.pem").items():
        lines.append(f"{name} = {value!r}".replace("'", '"'))
    cfg.write_text("\n".join(lines) + "\n")
    result = run_cli(cfg, "check-config")
    assert result.returncode == EXIT_USAGE
    (line,) = result.stderr.strip().splitlines()
    assert KEY in line and "is not an RSA private key" in line
    assert "PRIVATE KEY-----" not in result.stderr + result.stdout


def test_an_unreadable_secret_file_names_the_binding_and_the_file(tmp_path: Path) -> None:
    """Not only ``bindings[0]``: which binding, and the file the daemon tried."""
    binding = _binding(str(tmp_path / "absent.pem"))
    with pytest.raises(ConfigError) as raised:
        _parse(binding, {})
    message = str(raised.value)
    assert message.startswith(f"{KEY}: cannot read secret file of binding 'outreach-main' '")
    assert str(tmp_path / "absent.pem") in message
    assert message.endswith("No such file or directory")
