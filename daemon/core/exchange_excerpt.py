"""What a failed provider call sent and got back, made safe to keep (pure).

The attempt page of a failed call shows the request's and the response's body as a
bounded excerpt and the response's headers from an allow-list. Everything here is
decided before the row is written, so nothing secret is ever stored:

* headers: only the allow-listed names (content type, the provider's request and
  correlation ids, rate-limit and retry headers); never Authorization, cookies or
  any other header;
* JSON bodies: the value of every key that names a secret or a person's contact data
  (token, secret, password, authorization, api key, credential, cookie, session,
  signature, private key, email, phone) is replaced by ``"[redacted]"`` at any depth,
  then the document is re-encoded compactly;
* other bodies: ``Bearer <token>`` and ``<secret name>=<value>`` / ``"<name>": "<value>"``
  are replaced; control characters become spaces;
* then the text is cut to :data:`MAX_EXCERPT` characters (marked with ``…``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

MAX_EXCERPT = 2048
# A body larger than this is not parsed: its first MAX_SCAN bytes are read as text.
MAX_PARSE = 64 * 1024
MAX_SCAN = 8 * 1024
MAX_HEADER_VALUE = 200
REDACTED = "[redacted]"
# Response headers kept (lower-case); prefixes for the rate-limit families.
SAFE_HEADERS = frozenset({
    "content-type", "content-length", "date", "retry-after", "x-request-id",
    "request-id", "x-correlation-id", "x-trace-id",
    "x-amzn-requestid", "cf-ray",
})
SAFE_HEADER_PREFIXES = ("x-ratelimit-", "ratelimit-",
                        "x-rate-limit-")
_SENSITIVE_KEY = re.compile(
    r"token|secret|passw|authori[sz]ation|api[-_]?key|apikey|credential|cookie|session"
    r"|signature|private|email|phone|ssn", re.IGNORECASE)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_PAIR = re.compile(
    r"(?i)(\"?[A-Za-z0-9_.-]*(?:token|secret|passw|api[-_]?key|apikey|signature|session"
    r"|email|phone)[A-Za-z0-9_.-]*\"?\s*[:=]\s*)(\"[^\"]*\"|[^\s&,;\"}]+)")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@attrs.frozen(kw_only=True)
class ExchangeExcerpt:
    """A failed call's exchange, safe to store and show."""

    request_body: str
    response_headers: tuple[tuple[str, str], ...] = ()
    response_body: str = ""

    def to_json(self) -> str:
        return json.dumps({"request_body": self.request_body,
                           "response_headers": [list(h) for h in self.response_headers],
                           "response_body": self.response_body}, sort_keys=True)


def safe_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The allow-listed headers (names lower-cased, values bounded), in order."""
    kept = []
    for name, value in headers:
        low = name.lower()
        if low in SAFE_HEADERS or low.startswith(SAFE_HEADER_PREFIXES):
            kept.append((low, _bounded(_CONTROL.sub(" ", value), MAX_HEADER_VALUE)))
    return tuple(kept)


def _redact_doc(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {str(k): REDACTED if _SENSITIVE_KEY.search(str(k)) else _redact_doc(v)
                for k, v in node.items()}
    if isinstance(node, list):
        return [_redact_doc(v) for v in node]
    if isinstance(node, str):
        return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", node)
    return node


def _redact_text(text: str) -> str:
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _PAIR.sub(lambda m: m.group(1) + REDACTED, text)
    return _CONTROL.sub(" ", text)


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def body_excerpt(body: bytes, limit: int = MAX_EXCERPT) -> str:
    """A redacted, bounded excerpt of a request or response body ("" when empty)."""
    if not body:
        return ""
    if len(body) > MAX_PARSE:
        return _bounded(_redact_text(body[:MAX_SCAN].decode("utf-8", errors="replace")),
                        limit)
    text = body.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except ValueError:
        return _bounded(_redact_text(text), limit)
    if isinstance(doc, dict | list):
        return _bounded(json.dumps(_redact_doc(doc), separators=(",", ":"),
                                   ensure_ascii=False), limit)
    return _bounded(_redact_text(text), limit)


def excerpt_of(request_body: bytes, response_headers: Iterable[tuple[str, str]] = (),
               response_body: bytes = b"") -> ExchangeExcerpt:
    return ExchangeExcerpt(request_body=body_excerpt(request_body),
                           response_headers=safe_headers(response_headers),
                           response_body=body_excerpt(response_body))
