"""Signed session cookies and the CSRF tokens bound to them.

Theory of operation
-------------------
A session is a small signed (not encrypted) cookie: a random session id, the
operator's name (absent before sign-in), when it was issued, and a
fingerprint of the operator's password hash. Nothing secret is in it. The
signature (HMAC via ``itsdangerous``, keyed by ``admin.session_secret``)
makes it unforgeable, and it is refused once ``admin.session_ttl`` has passed
since issue. Replicas that share the secret accept each other's sessions.

* The operator's *role* is not in the cookie: it is read from the current
  ``[[operators]]`` on every request, so a role change applies at once and a
  removed operator is signed out at once.
* The fingerprint is an HMAC of the password hash: changing an operator's
  password ends their sessions; the hash itself never leaves the server.
* The CSRF token is ``HMAC(secret, "csrf" + session id)``: bound to the
  session, unguessable without the secret, rotated with the session id (a new
  id is minted at sign-in, so a planted pre-sign-in cookie is useless).

Sessions are stateless: signing out deletes the cookie, but a copy of it stays
valid until it expires. Rotate the session secret to end every session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable

import attrs
from itsdangerous import BadSignature, URLSafeTimedSerializer

from config.settings import Operator
from daemon.services.clock import wall_seconds

COOKIE_NAME = "integrationd_session"
COOKIE_PATH = "/admin"
_SALT = "integrationd.admin.session.v1"


@attrs.frozen
class SessionData:
    """What the cookie says: ``operator`` is ``None`` before sign-in."""

    sid: str
    operator: str | None
    issued_at: float
    fingerprint: str = ""


@attrs.frozen
class Principal:
    """The signed-in operator for one request (role read from the current settings)."""

    name: str
    role: str
    session: SessionData
    csrf_token: str = attrs.field(repr=False)


class SessionCodec:
    """Encode, verify and expire session cookies; derive CSRF tokens."""

    def __init__(self, secret: bytes, ttl_s: float,
                 now_s: Callable[[], float] = wall_seconds) -> None:
        if len(secret) < 16:
            raise ValueError("admin.session_secret: must be at least 16 bytes long")
        self._secret = secret
        self.ttl_s = ttl_s
        self._now_s = now_s
        self._serializer = URLSafeTimedSerializer(secret, salt=_SALT)

    def __repr__(self) -> str:
        return f"SessionCodec(ttl_s={self.ttl_s})"

    def new(self, operator: Operator | None) -> SessionData:
        return SessionData(
            sid=secrets.token_urlsafe(18),
            operator=operator.name if operator else None,
            issued_at=self._now_s(),
            fingerprint=self.fingerprint(operator) if operator else "",
        )

    def dumps(self, data: SessionData) -> str:
        doc = {"sid": data.sid, "op": data.operator, "iat": data.issued_at,
               "fp": data.fingerprint}
        return str(self._serializer.dumps(doc))

    def loads(self, text: str | None) -> SessionData | None:
        """The session, or ``None`` when missing, forged, malformed or expired."""
        if not text or len(text) > 1024:
            return None
        try:
            doc = self._serializer.loads(text, max_age=int(self.ttl_s) + 1)
        except BadSignature:  # also SignatureExpired
            return None
        if not isinstance(doc, dict):
            return None
        sid, op, iat, fp = doc.get("sid"), doc.get("op"), doc.get("iat"), doc.get("fp")
        if not isinstance(sid, str) or not isinstance(fp, str):
            return None
        if op is not None and not isinstance(op, str):
            return None
        if not isinstance(iat, int | float) or self._now_s() - iat > self.ttl_s:
            return None
        return SessionData(sid, op, float(iat), fp)

    def fingerprint(self, operator: Operator) -> str:
        mac = hmac.new(self._secret, b"operator\x00", hashlib.sha256)
        mac.update(operator.name.encode() + b"\x00" + operator.password_hash.encode())
        return mac.hexdigest()[:24]

    def csrf_token(self, data: SessionData) -> str:
        return hmac.new(self._secret, b"csrf\x00" + data.sid.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, data: SessionData | None, token: str | None) -> bool:
        if data is None or not token:
            return False
        return hmac.compare_digest(self.csrf_token(data), token)

    def remaining_s(self, data: SessionData) -> float:
        return max(0.0, data.issued_at + self.ttl_s - self._now_s())
