"""Token keys come from systemd credentials or key files, never the TOML; every problem is
one error naming the key id."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from config.keys import load_token_keys
from config.load import ConfigError
from config.settings import KeysSettings

RAW = bytes(range(32))


def test_keys_from_a_credential_and_a_file(tmp_path: Path) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "token-key-k2").write_text(RAW.hex() + "\n")
    keydir = tmp_path / "keys"
    keydir.mkdir()
    (keydir / "k1.key").write_text(base64.b64encode(RAW[::-1]).decode())
    keys = load_token_keys(KeysSettings(active="k2", previous="k1", dir="keys"),
                           {"CREDENTIALS_DIRECTORY": str(creds)}, str(tmp_path))
    assert sorted(keys) == ["k1", "k2"]
    assert keys["k2"].material == RAW and keys["k1"].material == RAW[::-1]
    assert RAW.hex() not in repr(keys)


def test_the_credential_wins_over_the_file(tmp_path: Path) -> None:
    (tmp_path / "token-key-k1").write_text(RAW.hex())
    (tmp_path / "k1.key").write_text(bytes(32).hex())
    keys = load_token_keys(KeysSettings(active="k1", dir="."),
                           {"CREDENTIALS_DIRECTORY": str(tmp_path)}, str(tmp_path))
    assert keys["k1"].material == RAW


def test_no_keys_configured_is_no_keys(tmp_path: Path) -> None:
    assert load_token_keys(KeysSettings(), {}, str(tmp_path)) == {}


BAD = [
    # (settings, file content or None, key of the error, fragment)
    (KeysSettings(active="k1", dir="."), None, "keys.k1", "token key 'k1' not found in"),
    (KeysSettings(active="k1"), None, "keys.k1", "not found in nowhere"),
    (KeysSettings(active="k1", dir="."), "abcd", "keys.k1", "is not 32 bytes"),
    (KeysSettings(active="k1", dir="."), RAW.hex()[:-2], "keys.k1", "is not 32 bytes"),
    (KeysSettings(active="k1", dir="."), base64.b64encode(RAW + b"x").decode(), "keys.k1",
     "is not 32 bytes"),
    (KeysSettings(active="../etc", dir="."), None, "keys", "bad token key id"),
    (KeysSettings(active="k1", previous="k1", dir="."), RAW.hex(), "keys.previous",
     "listed twice"),
]


@pytest.mark.parametrize(("settings", "content", "key", "fragment"), BAD)
def test_bad_keys_are_one_error_naming_the_key(tmp_path: Path, settings: KeysSettings,
                                               content: str | None, key: str,
                                               fragment: str) -> None:
    if content is not None:
        (tmp_path / "k1.key").write_text(content)
    with pytest.raises(ConfigError) as info:
        load_token_keys(settings, {}, str(tmp_path))
    assert info.value.key == key
    assert fragment in str(info.value)
    assert RAW.hex() not in str(info.value)
