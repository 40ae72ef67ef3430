"""The Runtime handoff contract's pure parts: scope, handoff keys, result payloads.

``EffectHandoffKey`` grammar (version 1)::

    ehk1:<org>:<app_installation>:<runtime_capability>:<binding_digest>:<handoff_id>

Each component is percent-encoded (RFC 3986 unreserved characters stay as
they are), so ``:`` only ever separates. The first four components are the
complete ``TrustedRuntimeWorkScope``; integrationd compares them with the
scope of the *authenticated caller*, never with payload fields. The last is
the Runtime's own identity for the handoff (its intent id).
"""

from __future__ import annotations

import enum
import functools
import json
import re
import urllib.parse

import attrs

from daemon.core.canonical import canonical_bytes, sha256_digest

HANDOFF_KEY_PREFIX = "ehk1"
MAX_HANDOFF_KEY_CHARS = 512
# RFC 3986 unreserved characters (ASCII only: ``\w`` would also take other scripts'
# letters, which ``quote`` encodes): percent-decoding and encoding leave such a run as is.
_UNRESERVED = re.compile(r"[A-Za-z0-9._~-]+", re.ASCII)


class BadHandoffKey(ValueError):
    pass


@attrs.frozen
class TrustedRuntimeWorkScope:
    org_id: str
    app_installation_id: str
    runtime_capability_id: str
    runtime_work_binding_digest: str

    def as_json(self) -> dict[str, str]:
        return attrs.asdict(self)


@attrs.frozen
class EffectHandoffKey:
    scope: TrustedRuntimeWorkScope
    handoff_id: str

    def encode(self) -> str:
        parts = (
            self.scope.org_id,
            self.scope.app_installation_id,
            self.scope.runtime_capability_id,
            self.scope.runtime_work_binding_digest,
            self.handoff_id,
        )
        if not all(parts):
            raise BadHandoffKey("every handoff key component must be non-empty")
        text = ":".join([HANDOFF_KEY_PREFIX, *(urllib.parse.quote(p, safe="") for p in parts)])
        if len(text) > MAX_HANDOFF_KEY_CHARS:
            raise BadHandoffKey(f"handoff key longer than {MAX_HANDOFF_KEY_CHARS} characters")
        return text

    @classmethod
    def parse(cls, text: str) -> EffectHandoffKey:
        if len(text) > MAX_HANDOFF_KEY_CHARS:
            raise BadHandoffKey(f"handoff key longer than {MAX_HANDOFF_KEY_CHARS} characters")
        # The common case, without decoding and re-encoding all five components: a key
        # whose scope prefix is canonical (parsed once per distinct prefix: a Runtime
        # sends the same scope every time) and whose handoff id is unreserved characters
        # only, so decoding and encoding leave it as it is.
        prefix, _, handoff_id = text.rpartition(":")
        if _UNRESERVED.fullmatch(handoff_id):
            scope = _canonical_scope(prefix)
            if scope is not None:
                return cls(scope, handoff_id)
        parts = text.split(":")
        if len(parts) != 6 or parts[0] != HANDOFF_KEY_PREFIX:
            raise BadHandoffKey("expected ehk1:<org>:<install>:<capability>:<binding>:<id>")
        try:
            org, install, capability, binding, handoff_id = (
                urllib.parse.unquote(p, errors="strict") for p in parts[1:]
            )
        except UnicodeDecodeError:
            raise BadHandoffKey("handoff key components must be UTF-8") from None
        if not all((org, install, capability, binding, handoff_id)):
            raise BadHandoffKey("every handoff key component must be non-empty")
        key = cls(TrustedRuntimeWorkScope(org, install, capability, binding), handoff_id)
        if key.encode() != text:
            raise BadHandoffKey("handoff key is not in canonical form")
        return key


@functools.lru_cache(maxsize=256)
def _canonical_scope(prefix: str) -> TrustedRuntimeWorkScope | None:
    """The scope ``ehk1:<org>:<install>:<capability>:<binding>`` names when it is in
    canonical form (each component non-empty, UTF-8, encoded as :meth:`encode` encodes
    it); None for anything else, which :meth:`EffectHandoffKey.parse` then refuses with
    its own reasons."""
    parts = prefix.split(":")
    if len(parts) != 5 or parts[0] != HANDOFF_KEY_PREFIX:
        return None
    try:
        org, install, capability, binding = (urllib.parse.unquote(p, errors="strict")
                                             for p in parts[1:])
    except UnicodeDecodeError:
        return None
    if not all((org, install, capability, binding)):
        return None
    if any(urllib.parse.quote(decoded, safe="") != part
           for decoded, part in zip((org, install, capability, binding), parts[1:],
                                    strict=True)):
        return None
    return TrustedRuntimeWorkScope(org, install, capability, binding)


class NoEffectReason(enum.StrEnum):
    REJECTED_BEFORE_DISPATCH = "REJECTED_BEFORE_DISPATCH"
    DEFINITIVE_NO_EFFECT = "DEFINITIVE_NO_EFFECT"


RESULT_FORMAT_SUCCESS = 1  # success: RemoteID, no typed result
RESULT_FORMAT_NO_EFFECT = 2  # ResourceNoEffectResultFormatV1
NO_EFFECT_INTENT_KINDS = frozenset({"UPSERT", "DELETE"})


@attrs.frozen
class NoEffectResult:
    """``ResourceNoEffectResultV1``: canonical bytes and their digest."""

    reason: NoEffectReason

    @property
    def canonical(self) -> bytes:
        return canonical_bytes({"outcome": "NO_EFFECT", "reason": self.reason.value,
                                "version": 1})

    @property
    def digest(self) -> str:
        return sha256_digest(self.canonical)


def parse_no_effect(canonical: str, digest: str) -> NoEffectResult:
    """Validate a format-2 result: exact canonical bytes, matching digest, closed reason."""
    if sha256_digest(canonical.encode()) != digest:
        raise ValueError("result digest does not match the canonical result")
    try:
        doc = json.loads(canonical)
    except ValueError:
        raise ValueError("canonical result is not JSON") from None
    if not isinstance(doc, dict) or set(doc) != {"outcome", "reason", "version"}:
        raise ValueError("canonical result must have exactly outcome, reason, version")
    if doc["version"] != 1 or doc["outcome"] != "NO_EFFECT":
        raise ValueError("canonical result must be version 1 NO_EFFECT")
    try:
        result = NoEffectResult(NoEffectReason(doc["reason"]))
    except ValueError:
        raise ValueError(f"unknown no-effect reason {doc['reason']!r}") from None
    if result.canonical.decode() != canonical:
        raise ValueError("canonical result is not in canonical form")
    return result


def commit_result_request(*, scope: TrustedRuntimeWorkScope, intent_id: str, command_id: str,
                          payload_digest: str, catalog_revision: int,
                          result_format_version: int, remote_id: str, canonical_result: str,
                          result_digest: str) -> dict[str, object]:
    """The ``CommitResultRequest`` body a receipt sends to the Runtime (seed 003)."""
    return {
        "scope": scope.as_json(),
        "intent_id": intent_id,
        "command_id": command_id,
        "payload_digest": payload_digest,
        "catalog_revision": catalog_revision,
        "result_format_version": result_format_version,
        "remote_id": remote_id,
        "canonical_result": canonical_result,
        "result_digest": result_digest,
    }
