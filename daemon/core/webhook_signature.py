"""Webhook signature verification, parameterized by L1 data (pure).

Theory of operation
-------------------
A provider signs each delivery with an HMAC over some bytes of the request. The L1
route contract says which (:class:`SignatureSpec`): the header that carries the
signature, the digest (SHA-256), how the digest is written (hex or base64), and what is
signed: the raw body alone, or a concatenation of parts such as method + URI + body +
timestamp. An optional timestamp header with a tolerance bounds replays.

:func:`verify` takes the *byte-identical* raw body (never a re-serialization: a body
parsed and dumped again has other bytes and fails), every secret currently active for the
route (during a rotation the old and the new one), and the clock reading to judge the
timestamp by. Each candidate digest is compared with :func:`hmac.compare_digest` (constant
time), and every secret is tried whatever the first one gave, so the time taken does not
tell which secret matched.

The answer is a :class:`Verdict`: accepted, or refused with a stable ``reason``
(``missing_signature``, ``bad_signature``, ``missing_timestamp``, ``bad_timestamp``,
``stale_timestamp``, ``no_secret``). Nothing here logs, and nothing returned carries a
secret or a signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

ALGORITHMS: Final = {"sha256": hashlib.sha256}
ENCODINGS: Final = frozenset({"hex", "base64"})
# What a signature may cover, in the order the L1 contract lists them.
PARTS: Final = frozenset({"method", "uri", "body", "timestamp"})
TIMESTAMP_UNITS: Final = {"s": 1_000_000, "ms": 1_000}

REASONS: Final = frozenset({"missing_signature", "bad_signature", "missing_timestamp",
                            "bad_timestamp", "stale_timestamp", "no_secret"})


class BadSignatureSpec(ValueError):
    """An L1 signature contract that cannot be verified (names the field)."""


@attrs.frozen(kw_only=True)
class SignatureSpec:
    """How one provider signs a webhook delivery (L1 data)."""

    header: str                              # lower-case header name
    algorithm: str = "sha256"
    encoding: str = "hex"                    # hex | base64
    signed: tuple[str, ...] = ("body",)      # concatenated in this order
    timestamp_header: str = ""               # lower-case; "" = none
    timestamp_unit: str = "s"                # s | ms
    tolerance_s: float = 300.0               # how old (or early) a timestamp may be

    def __attrs_post_init__(self) -> None:
        if not self.header:
            raise BadSignatureSpec("header: required")
        if self.algorithm not in ALGORITHMS:
            raise BadSignatureSpec(f"algorithm: {self.algorithm!r} is not one of"
                                   f" {sorted(ALGORITHMS)}")
        if self.encoding not in ENCODINGS:
            raise BadSignatureSpec(f"encoding: {self.encoding!r} is not one of"
                                   f" {sorted(ENCODINGS)}")
        if not self.signed or any(p not in PARTS for p in self.signed):
            raise BadSignatureSpec(f"signed: expected parts from {sorted(PARTS)}")
        if "body" not in self.signed:
            raise BadSignatureSpec("signed: must include body")
        if len(set(self.signed)) != len(self.signed):
            raise BadSignatureSpec("signed: a part appears twice")
        if ("timestamp" in self.signed) != bool(self.timestamp_header):
            raise BadSignatureSpec("timestamp_header: required exactly when the timestamp"
                                   " is signed")
        if self.timestamp_unit not in TIMESTAMP_UNITS:
            raise BadSignatureSpec(f"timestamp_unit: {self.timestamp_unit!r} is not one of"
                                   f" {sorted(TIMESTAMP_UNITS)}")
        if self.tolerance_s <= 0:
            raise BadSignatureSpec("tolerance_s: must be positive")


@attrs.frozen
class Verdict:
    ok: bool
    reason: str = ""            # "" when ok; one of REASONS otherwise
    secret_index: int = -1      # which active secret matched (0 = newest), for rotation



def signed_bytes(spec: SignatureSpec, *, method: str, uri: str, body: bytes,
                 timestamp: str) -> bytes:
    """The bytes the provider's HMAC covers (``uri``: the URI as the provider called it)."""
    pieces = {"method": method.encode("ascii", "replace"), "uri": uri.encode("utf-8"),
              "body": body, "timestamp": timestamp.encode("ascii", "replace")}
    return b"".join(pieces[p] for p in spec.signed)


def digest(spec: SignatureSpec, secret: bytes, message: bytes) -> bytes:
    return hmac.new(secret, message, ALGORITHMS[spec.algorithm]).digest()


def encode_digest(spec: SignatureSpec, raw: bytes) -> str:
    """How the provider writes a digest in its header (the signing side, for tests)."""
    return raw.hex() if spec.encoding == "hex" else base64.b64encode(raw).decode()


def _decode_signature(spec: SignatureSpec, text: str) -> bytes | None:
    text = text.strip()
    try:
        if spec.encoding == "hex":
            return bytes.fromhex(text)
        return base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        return None


def _timestamp_us(spec: SignatureSpec, text: str) -> int | None:
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    return int(text) * TIMESTAMP_UNITS[spec.timestamp_unit]


def verify(spec: SignatureSpec, secrets: Sequence[bytes], *, method: str, uri: str,
           body: bytes, headers: Mapping[str, str], now_us: int) -> Verdict:
    """Judge one delivery. ``headers`` has lower-case names; ``secrets`` newest first."""
    if not secrets:
        return Verdict(False, "no_secret")
    supplied = headers.get(spec.header)
    if supplied is None or not supplied.strip():
        return Verdict(False, "missing_signature")
    timestamp = ""
    if spec.timestamp_header:
        timestamp = headers.get(spec.timestamp_header, "").strip()
        if not timestamp:
            return Verdict(False, "missing_timestamp")
        at_us = _timestamp_us(spec, timestamp)
        if at_us is None:
            return Verdict(False, "bad_timestamp")
        if abs(now_us - at_us) > spec.tolerance_s * 1_000_000:
            return Verdict(False, "stale_timestamp")
    wanted = _decode_signature(spec, supplied)
    if wanted is None:
        return Verdict(False, "bad_signature")
    message = signed_bytes(spec, method=method, uri=uri, body=body, timestamp=timestamp)
    matched = -1
    for index, secret in enumerate(secrets):
        # Every secret is tried: the time taken does not say which one matched.
        if hmac.compare_digest(digest(spec, secret, message), wanted) and matched < 0:
            matched = index
    if matched < 0:
        return Verdict(False, "bad_signature")
    return Verdict(True, "", matched)
