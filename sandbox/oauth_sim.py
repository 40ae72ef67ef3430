"""An OAuth 2.0 token endpoint with rotating refresh tokens, as real providers run it.

``POST /oauth/v1/token`` (``application/x-www-form-urlencoded``) with
``grant_type=refresh_token``, ``refresh_token``, ``client_id`` and ``client_secret`` answers a
new access token *and a new refresh token*; the refresh token presented is invalid from
then on, so a second refresh with it (a double refresh by two replicas) is answered
``400 {"error": "invalid_grant"}``, exactly as a provider would. Every call is journaled
(which refresh token, which answer) so a test can count refreshes per token version.

Control (the test's hands): ``POST /_oauth/grants`` ``{"refresh_token": ...}`` seeds a valid
refresh token; ``POST /_oauth/behaviour`` ``{"hang": true}`` / ``{"malformed": true}`` /
``{"revoke_all": true}`` injects faults, ``{"answer_delay_s": N}`` answers a successful
refresh N seconds late (trio time, so a test's MockClock drives it) *after* rotating, as a
provider whose answer is slow on its way back; ``GET /_oauth/journal`` reads the journal.
Tokens here are test values, but the journal still records only their hashes.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from sandbox.h11_server import H11Server, Request, Response

_JSON = (("content-type", "application/json"),)


def token_digest(token: str) -> str:
    """How the journal names a refresh token (a prefix of its SHA-256, never the token)."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


@attrs.define(eq=False)
class OAuthSimulator:
    # The client credentials the token endpoint expects (tests make random ones).
    client_secret: str
    client_id: str = "client-1"
    lifetime_s: int = 1800
    valid_refresh: set[str] = attrs.field(factory=set)
    access_tokens: set[str] = attrs.field(factory=set)
    journal: list[dict[str, object]] = attrs.field(factory=list)
    hang: bool = False
    malformed: bool = False
    # False: answer without a new refresh token (the old one stays valid), as some do.
    rotate: bool = True
    # Seconds between rotating the refresh token and answering (0: at once).
    answer_delay_s: float = 0.0
    # Set at the first token call (a test waits on it).
    called: trio.Event = attrs.field(factory=trio.Event)

    def seed(self, refresh_token: str) -> None:
        self.valid_refresh.add(refresh_token)

    async def handle(self, request: Request) -> Response:
        if request.path == "/oauth/v1/token" and request.method == "POST":
            return await self._token(request)
        if request.path == "/_oauth/grants" and request.method == "POST":
            self.seed(str(json.loads(request.body)["refresh_token"]))
            return Response(204)
        if request.path == "/_oauth/behaviour" and request.method == "POST":
            doc = json.loads(request.body)
            delay = doc.get("answer_delay_s", self.answer_delay_s)
            if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
                # Refused whole: no other behaviour of this request is applied.
                return Response(400, b'{"error":"answer_delay_s must be a number >= 0"}',
                                _JSON)
            self.answer_delay_s = float(delay)
            self.hang = bool(doc.get("hang", self.hang))
            self.malformed = bool(doc.get("malformed", self.malformed))
            self.rotate = bool(doc.get("rotate", self.rotate))
            if doc.get("revoke_all"):
                self.valid_refresh.clear()
            return Response(204)
        if request.path == "/_oauth/journal" and request.method == "GET":
            return Response(200, json.dumps(self.journal).encode(), _JSON)
        return Response(404, b'{"error":"not_found"}', _JSON)

    async def _token(self, request: Request) -> Response:
        form = dict(urllib.parse.parse_qsl(request.body.decode("utf-8", "replace")))
        presented = form.get("refresh_token", "")
        entry: dict[str, object] = {"refresh_token": token_digest(presented)}
        self.journal.append(entry)
        self.called.set()
        if self.hang:
            entry["answer"] = "hang"
            await trio.sleep_forever()
        if (form.get("client_id"), form.get("client_secret")) != (self.client_id,
                                                                  self.client_secret):
            entry["answer"] = "invalid_client"
            return Response(401, b'{"error":"invalid_client"}', _JSON)
        if form.get("grant_type") != "refresh_token" or presented not in self.valid_refresh:
            entry["answer"] = "invalid_grant"
            return Response(400, b'{"error":"invalid_grant"}', _JSON)
        if self.malformed:
            entry["answer"] = "malformed"
            return Response(200, b'{"access_token": 5}', _JSON)
        access = secrets.token_urlsafe(24)
        self.access_tokens.add(access)
        entry["answer"] = "ok"
        body: dict[str, object] = {"access_token": access, "token_type": "bearer",
                                   "expires_in": self.lifetime_s}
        if self.rotate:
            self.valid_refresh.discard(presented)  # rotating: used once
            refresh = secrets.token_urlsafe(24)
            self.valid_refresh.add(refresh)
            body["refresh_token"] = refresh
        if self.answer_delay_s:
            await trio.sleep(self.answer_delay_s)  # rotated already: the answer is late
        return Response(200, json.dumps(body).encode(), _JSON)

    async def run(self, host: str = "127.0.0.1", port: int = 0, *,
                  task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await H11Server(self.handle).run(host, port, task_status=task_status)


@asynccontextmanager
async def running_oauth(client_secret: str) -> AsyncIterator[tuple[OAuthSimulator, str]]:
    """A simulator on a loopback port, and its token endpoint's URL, until the block ends."""
    sim = OAuthSimulator(client_secret=client_secret)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sim.run)
        yield sim, f"http://127.0.0.1:{port}/oauth/v1/token"
        nursery.cancel_scope.cancel()


def refreshes_per_token(journal: list[dict[str, object]]) -> dict[str, int]:
    """How many token calls presented each refresh token (a double refresh shows as 2)."""
    counts: dict[str, int] = {}
    for entry in journal:
        key = str(entry["refresh_token"])
        counts[key] = counts.get(key, 0) + 1
    return counts
