"""A separate OS process that needs a binding's access token: ``python -m
sandbox.refresh_racer SPEC`` (one JSON object: storage ``url``, ``owner``, ``token_url``,
``client_secret_file``, ``key_file``, ``start_at``, ``lease_s``; for an S2S mint instead
of a refresh: ``mint_url``, ``app_id`` and ``private_key_file``).

It claims one ``noop`` WorkItem of its own (a live fence, as a handler would hold), waits
for the shared start instant, asks the token owner for the access token of binding
``binding_id`` (default ``b1``) generation 1, and prints one JSON line: the token version
it got, or the stable reason (and message) it got none. It never prints a token.

``claim_s`` is its WorkItem lease (default 600 s).

``"stall"`` freezes it at one point of the refresh, for a test to SIGKILL it there: it
prints ``{"stalled": POINT}`` and sleeps: ``"before_dispatch"`` (the lease and its
in-flight record are taken, the dispatch marker is not written: the refresh token never
left), ``"sigstop_before_dispatch"`` (the same point, but the process stops itself with
SIGSTOP, a real freeze, until the test sends SIGCONT; then it goes on to the marker),
``"before_call"`` (the marker is written, the request has not left: a successor
cannot tell this from a call that left), ``"after_answer"`` (the provider answered, so
a rotating refresh token is spent, and the new token was never activated).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from config.settings import Secret
from daemon.core.token_bundle import TokenKey
from daemon.services.clock import WallClock
from daemon.services.token_refresh import (
    MintEndpoint,
    RefreshEndpoint,
    TokenOwner,
    TokenUnavailable,
)
from storage.open import open_store
from storage.port import ClaimParams, LostLease
from storage.refresh_leases import MarkerRefused


class _Stall(httpx.AsyncBaseTransport):
    """The racer's transport to the token endpoint, stalling at ``point``."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.point == "before_call":
            await _stalled(self.point)
        response = await self.inner.handle_async_request(request)
        if self.point == "after_answer":
            await response.aread()
            await _stalled(self.point)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def _stalled(point: str) -> None:
    sys.stdout.write(json.dumps({"stalled": point}) + "\n")
    sys.stdout.flush()
    await trio.sleep_forever()


async def race(spec: dict[str, Any]) -> dict[str, Any]:
    store = await open_store(spec["url"], pool_size=2, sqlite_synchronous="NORMAL")
    if spec.get("stall") == "before_dispatch":
        async def stalled_dispatch(**_: object) -> bool:
            await _stalled("before_dispatch")
            return False

        setattr(store, "refresh_dispatch", stalled_dispatch)  # noqa: B010
    elif spec.get("stall") == "sigstop_before_dispatch":
        marker = store.refresh_dispatch

        async def frozen_dispatch(**kw: Any) -> MarkerRefused | None:
            sys.stdout.write(json.dumps({"stalled": "sigstop_before_dispatch"}) + "\n")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen here until SIGCONT
            return await marker(**kw)

        setattr(store, "refresh_dispatch", frozen_dispatch)  # noqa: B010
    clock = WallClock()
    key = TokenKey("k1", bytes.fromhex(spec["key_hex"]))
    endpoint: RefreshEndpoint | MintEndpoint
    if "mint_url" in spec:
        endpoint = MintEndpoint(spec["mint_url"], spec["app_id"], Secret(spec["private_key"]))
    else:
        endpoint = RefreshEndpoint(spec["token_url"], "client-1",
                                   Secret(spec["client_secret"]))
    out: dict[str, Any] = {"owner": spec["owner"]}
    try:
        fence = None
        while fence is None:
            got = await store.work_claim(
                ClaimParams(family="noop", owner=spec["owner"], limit=1,
                            lease_ttl_us=int(spec.get("claim_s", 600) * 1_000_000),
                            window=64), clock.now_us())
            fence = got.claimed[0].fence if got.claimed else None
            if fence is None:
                await trio.sleep(0.05)
        await trio.sleep(max(0.0, spec["start_at"] - time.time()))
        lease_us = int(spec.get("lease_s", 30) * 1_000_000)
        stall = spec.get("stall")
        transport = _Stall(stall) if stall in ("before_call", "after_answer") else None
        async with httpx.AsyncClient(timeout=60, transport=transport) as http:
            owner = TokenOwner(store, {"k1": key}, "k1", http, clock, lease_us=lease_us,
                               call_margin_us=lease_us // 4, wait_us=lease_us * 4)
            try:
                token = await owner.access_token(fence, spec.get("binding_id", "b1"), 1,
                                                 endpoint)
                out["version"] = token.token_version
            except TokenUnavailable as exc:
                out["reason"] = exc.reason
                out["message"] = str(exc)  # stable text, never a token
            except LostLease:
                out["reason"] = "lease_lost"  # the claim is gone: it stopped, as a handler
    finally:
        await store.db.aclose()
    return out


async def _main(spec: dict[str, Any]) -> None:
    result = await race(spec)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def _load(raw: str) -> dict[str, Any]:
    """The spec, with the key and the client secret read from their files (never argv)."""
    spec = dict(json.loads(raw))
    spec["key_hex"] = Path(spec.pop("key_file")).read_text().strip()
    if "client_secret_file" in spec:
        spec["client_secret"] = Path(spec.pop("client_secret_file")).read_text().strip()
    if "private_key_file" in spec:
        spec["private_key"] = Path(spec.pop("private_key_file")).read_text()
    return spec


if __name__ == "__main__":
    trio.run(_main, _load(sys.argv[1]))
