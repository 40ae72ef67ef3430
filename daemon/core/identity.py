"""Remote-identity codecs, version 2 (pure; byte layouts in docs/identity.md).

``IntegrationScopeDigest``, ``IntegrationLinkKeyV2`` and
``IntegrationRemoteLocatorHash`` are codecs over coordinates that were
already authorized and validated. They are not a registry, a selector, an
ownership proof or a permission check: callers still compare complete
identities and owned receipts. Golden vectors (tests/golden/identity_v2.json)
freeze every byte.

Layout rules shared by all three: each is SHA-256 over a domain tag, the
record separator 0x1E, then the fields joined by the unit separator 0x1F,
all UTF-8. No field may be empty or contain 0x1E/0x1F (so the encoding is
unambiguous). The Catalog revision is deliberately not a coordinate: an
upgrade must never move a remote identity.
"""

from __future__ import annotations

import hashlib
import re

RS = b"\x1e"
US = b"\x1f"
SCOPE_TAG = b"IntegrationScope/v2"
# The historical discriminator of the outbound push path; kept byte-for-byte so
# link keys stay stable across the move from the old claim loop to the kernel.
LINK_DISCRIMINATOR = b"PushToConnector"
LINK_PREFIX = "ilk2:"
LOCATOR_TAG = b"IntegrationRemoteLocator/v2"
# Remote ids are compared after trimming this whitespace at both ends.
REMOTE_ID_WHITESPACE = " \t\r\n"
_HEX64 = re.compile(r"[0-9a-f]{64}")


class BadCoordinate(ValueError):
    pass


def _field(name: str, value: str) -> bytes:
    if not value:
        raise BadCoordinate(f"{name} must not be empty")
    data = value.encode("utf-8")
    if RS in data or US in data:
        raise BadCoordinate(f"{name} must not contain separator bytes 0x1E/0x1F")
    return data


def _digest(tag: bytes, fields: list[bytes]) -> str:
    return hashlib.sha256(tag + RS + US.join(fields)).hexdigest()


def integration_scope_digest(
    org_id: str, app_installation_id: str, provider: str, remote_account_id: str
) -> str:
    """64 hex chars identifying where remote identities live (no Catalog revision)."""
    return _digest(
        SCOPE_TAG,
        [
            _field("org_id", org_id),
            _field("app_installation_id", app_installation_id),
            _field("provider", provider),
            _field("remote_account_id", remote_account_id),
        ],
    )


def _scope_field(scope_digest: str) -> bytes:
    if _HEX64.fullmatch(scope_digest) is None:
        raise BadCoordinate("scope_digest must be 64 lowercase hex characters")
    return scope_digest.encode("ascii")


def integration_link_key_v2(scope_digest: str, local_object: str, local_id: str) -> str:
    """``ilk2:`` + 64 hex: the local side of a remote link."""
    return LINK_PREFIX + _digest(
        LINK_DISCRIMINATOR,
        [_scope_field(scope_digest), _field("local_object", local_object),
         _field("local_id", local_id)],
    )


def normalize_remote_id(remote_id: str) -> str:
    normalized = remote_id.strip(REMOTE_ID_WHITESPACE)
    if not normalized:
        raise BadCoordinate("remote_id must not be empty")
    return normalized


def integration_remote_locator_hash(scope_digest: str, remote_object: str, remote_id: str) -> str:
    """64 hex: the remote side of a remote link (remote id whitespace-normalized)."""
    return _digest(
        LOCATOR_TAG,
        [_scope_field(scope_digest), _field("remote_object", remote_object),
         _field("remote_id", normalize_remote_id(remote_id))],
    )
