"""Load token-bundle encryption keys from systemd credentials or key files.

A key is 32 bytes written as 64 hex digits or as base64, in ``$CREDENTIALS_DIRECTORY/
token-key-ID`` (``LoadCredential=token-key-ID:...``) or ``[keys] dir``/``ID.key``. Keys
never come from the TOML. Every problem is a :class:`ConfigError` naming the key id,
which the CLI prints as one line and exits 2.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from pathlib import Path

from config.load import ConfigError
from config.settings import KeysSettings
from daemon.core.token_bundle import KEY_BYTES, TokenKey

_KEY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_HEX = re.compile(r"[0-9a-fA-F]{64}")


def key_ids(settings: KeysSettings) -> list[str]:
    """The active key first, then the previous ones, each checked for a sane id."""
    ids = [settings.active] if settings.active else []
    ids += [k.strip() for k in settings.previous.split(",") if k.strip()]
    for key_id in ids:
        if not _KEY_ID.fullmatch(key_id):
            raise ConfigError("keys", f"bad token key id {key_id!r}")
    if len(set(ids)) != len(ids):
        raise ConfigError("keys.previous", "a key id is listed twice")
    return ids


def _decode(key_id: str, text: str) -> bytes:
    text = text.strip()
    if _HEX.fullmatch(text):
        return bytes.fromhex(text)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != KEY_BYTES:
        raise ConfigError(f"keys.{key_id}", f"token key {key_id!r} is not {KEY_BYTES} bytes"
                          " (64 hex digits or base64)")
    return raw


def load_token_keys(settings: KeysSettings, environ: Mapping[str, str],
                    base_dir: str = ".") -> dict[str, TokenKey]:
    """Every configured key, by id; a configured key that cannot be found is an error."""
    found: dict[str, TokenKey] = {}
    for key_id in key_ids(settings):
        places = []
        cred_dir = environ.get("CREDENTIALS_DIRECTORY")
        if cred_dir:
            places.append(Path(cred_dir) / f"token-key-{key_id}")
        if settings.dir:
            places.append(Path(base_dir) / settings.dir / f"{key_id}.key")
        for place in places:
            try:
                text = place.read_text()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ConfigError(f"keys.{key_id}", f"cannot read token key {key_id!r}:"
                                  f" {exc.strerror}") from None
            found[key_id] = TokenKey(key_id, _decode(key_id, text))
            break
        else:
            where = " or ".join(str(p) for p in places) or "nowhere (set keys.dir or"\
                " LoadCredential=token-key-ID)"
            raise ConfigError(f"keys.{key_id}", f"token key {key_id!r} not found in {where}")
    return found
