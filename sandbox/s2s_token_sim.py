"""A minimal Outreach S2S token endpoint: app JWT in, one-hour access token out.

``POST /api/app/installs/{install_id}/actions/accessToken`` with
``Authorization: Bearer <app JWT>``: the JWT must be RS256, signed by the app's private
key (checked with its public key), with ``iss`` = the app's S2S id, a current ``exp``
and ``iat``. The answer is ``{"token": ..., "expires_in": 3600}`` (the token is valid for
one hour, and is added to ``access_tokens``, which a provider simulator can share to
accept exactly the minted tokens). A wrong signature, issuer, algorithm or an expired
JWT is ``401 {"error": "invalid_jwt"}``; an unknown installation is 404. Every call is
journaled (installation, answer), never with a token.

Standalone (:meth:`S2STokenEndpoint.run`), or mounted in a larger simulator:
:func:`s2s_routes` returns its routes, :meth:`S2STokenEndpoint.handle_or_none` answers
only the requests that are its own.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Awaitable, Callable

import attrs
import jwt
import trio

from sandbox.h11_server import H11Server, Request, Response

_JSON = (("content-type", "application/json"),)
PATH = re.compile(r"^/api/app/installs/([^/]+)/actions/accessToken$")
LIFETIME_S = 3600

Route = tuple[str, re.Pattern[str], Callable[[Request, re.Match[str]], Awaitable[Response]]]


@attrs.define(eq=False)
class S2STokenEndpoint:
    # The app's S2S id (the JWT's ``iss``) and its public key (PEM).
    app_id: str
    public_key_pem: bytes = attrs.field(repr=False)
    installs: set[str] = attrs.field(factory=set)
    access_tokens: set[str] = attrs.field(factory=set)
    # Which installation each minted token belongs to (a reinstall test checks that no
    # request is ever made under the new installation's token by work queued before it).
    token_installs: dict[str, str] = attrs.field(factory=dict, repr=False)
    journal: list[dict[str, object]] = attrs.field(factory=list)
    # Set at the first mint call (a test waits on it).
    called: trio.Event = attrs.field(factory=trio.Event)

    async def mint(self, request: Request, match: re.Match[str]) -> Response:
        install = match.group(1)
        entry: dict[str, object] = {"install_id": install}
        self.journal.append(entry)
        self.called.set()
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        try:
            if scheme.lower() != "bearer":
                raise jwt.InvalidTokenError("no bearer JWT")
            jwt.decode(token, self.public_key_pem, algorithms=["RS256"], issuer=self.app_id,
                       options={"require": ["iss", "exp", "iat"]})
        except jwt.InvalidTokenError as exc:
            entry["answer"] = f"invalid_jwt:{type(exc).__name__}"
            return Response(401, b'{"error":"invalid_jwt"}', _JSON)
        if install not in self.installs:
            entry["answer"] = "unknown_install"
            return Response(404, b'{"error":"not_found"}', _JSON)
        access = secrets.token_urlsafe(24)
        self.access_tokens.add(access)
        self.token_installs[access] = install
        entry["answer"] = "ok"
        return Response(200, json.dumps({"token": access, "expires_in": LIFETIME_S}).encode(),
                        _JSON)

    async def handle_or_none(self, request: Request) -> Response | None:
        for method, pattern, handler in s2s_routes(self):
            match = pattern.match(request.path)
            if match is not None and request.method == method:
                return await handler(request, match)
        return None

    async def handle(self, request: Request) -> Response:
        answer = await self.handle_or_none(request)
        return answer or Response(404, b'{"error":"not_found"}', _JSON)

    async def run(self, host: str = "127.0.0.1", port: int = 0, *,
                  task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await H11Server(self.handle).run(host, port, task_status=task_status)


def s2s_routes(endpoint: S2STokenEndpoint) -> list[Route]:
    """The token endpoint's routes, for a simulator that mounts it beside its own."""
    return [("POST", PATH, endpoint.mint)]
