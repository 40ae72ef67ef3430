"""The keep-alive race on loopback: a client sends after an idle pause around its
server's keep-alive, and a request meets a connection the server is closing.

``python -m bench.keepalive_race [--server-keep-alive S] [--client-expiry S] [--requests N]``
serves a counting app with ``serve_app`` (our listeners' server), sends ``N`` requests on
one ``BoundedHttp`` (our clients), each after a pause of the server's keep-alive give
or take 4 ms, and prints one JSON line: transport failures (the sender would send those
again) and how many of them the server had already acted on (a resend of those is a
duplicate delivery). ``--client-expiry`` defaults to ours (``keepalive_below``: half the
server's keep-alive); ``--client-expiry 60`` is what the clients kept before. Real time:
each request costs one keep-alive of waiting, so the keep-alive is short (0.2 s)."""

from __future__ import annotations

import argparse
import json
import os
import random
from collections.abc import Sequence
from typing import Any

import httpx
import trio

from daemon.providers.executor import BoundedHttp, keepalive_below, origin_of
from daemon.services.http_server import serve_app


class _Counting:
    def __init__(self) -> None:
        self.acted_on: set[str] = set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        self.acted_on.add(scope["path"])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


async def race(server_keep_alive_s: float, client_expiry_s: float,
               requests: int) -> dict[str, Any]:
    app = _Counting()
    failed: list[tuple[str, str]] = []
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(
            lambda task_status: serve_app(app, "127.0.0.1:0",
                                          keep_alive_timeout_s=server_keep_alive_s,
                                          task_status=task_status))
        client = BoundedHttp.open(4, {origin_of(url): client_expiry_s})
        for n in range(requests):
            path = f"/r{n}"
            try:
                await client.request("POST", url + path, content=b"x", timeout_s=10.0)
            except httpx.HTTPError as exc:
                failed.append((path, type(exc).__name__))
            await trio.sleep(server_keep_alive_s + random.uniform(-0.004, 0.004))
        await client.aclose()
        nursery.cancel_scope.cancel()
    return {"server_keep_alive_s": server_keep_alive_s, "client_expiry_s": client_expiry_s,
            "requests": requests, "transport_failures": len(failed),
            "acted_on_then_failed": sum(1 for p, _ in failed if p in app.acted_on),
            "failures": sorted({kind for _, kind in failed}),
            "load": [round(x, 2) for x in os.getloadavg()]}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-keep-alive", type=float, default=0.2)
    parser.add_argument("--client-expiry", type=float, default=None,
                        help="seconds (default: ours, half the server's keep-alive)")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    expiry = (keepalive_below(args.server_keep_alive) if args.client_expiry is None
              else args.client_expiry)
    print(json.dumps(trio.run(race, args.server_keep_alive, expiry, args.requests)))


if __name__ == "__main__":
    main()
