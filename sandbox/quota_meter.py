"""A provider stand-in that enforces a request quota and audits every arrival.

``GET /q/{key}`` is one provider request against quota key ``key``. The meter keeps every
arrival time per key and answers, as a provider would, ``200`` while the request fits in
``limit`` per sliding ``window`` and ``429`` (with ``Retry-After``) when it does not.
Arrivals are counted by the meter's own clock, the provider's definition of a window, so
a client cannot argue with it. ``GET /_meter`` reports per key: arrivals, 429s and the
largest number of arrivals seen in any window (``violations`` counts arrivals beyond the
limit). Run it with ``python -m sandbox.quota_meter --limit N --window S`` (it prints its
port) or start :class:`QuotaMeter` in a nursery.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from collections.abc import Callable

import attrs
import trio

from sandbox.h11_server import H11Server, Request, Response

_JSON = (("content-type", "application/json"),)


@attrs.define
class KeyLedger:
    arrivals: list[float] = attrs.field(factory=list)
    accepted: list[float] = attrs.field(factory=list)
    throttled: int = 0
    worst_window: int = 0


@attrs.define(eq=False)
class QuotaMeter:
    limit: int
    window_s: float
    clock: Callable[[], float] = time.monotonic
    keys: dict[str, KeyLedger] = attrs.field(factory=dict)

    def arrive(self, key: str) -> Response:
        now = self.clock()
        ledger = self.keys.setdefault(key, KeyLedger())
        ledger.arrivals.append(now)
        recent = len(ledger.accepted) - bisect.bisect_right(ledger.accepted,
                                                            now - self.window_s)
        # Every arrival counts against the provider's window, accepted or not: the
        # worst window is what a provider would have seen.
        in_window = len(ledger.arrivals) - bisect.bisect_right(ledger.arrivals,
                                                               now - self.window_s)
        ledger.worst_window = max(ledger.worst_window, in_window)
        if recent >= self.limit:
            ledger.throttled += 1
            oldest = ledger.accepted[len(ledger.accepted) - recent]
            retry_after = max(1, int(oldest + self.window_s - now + 0.999))
            return Response(429, b'{"error":"rate limited"}',
                            (*_JSON, ("retry-after", str(retry_after))))
        ledger.accepted.append(now)
        return Response(200, b'{"ok":true}', _JSON)

    def report(self) -> dict[str, object]:
        per_key = {
            key: {"arrivals": len(k.arrivals), "throttled": k.throttled,
                  "worst_window": k.worst_window,
                  "violations": max(0, k.worst_window - self.limit)}
            for key, k in self.keys.items()
        }
        times = [t for k in self.keys.values() for t in k.arrivals]
        return {"limit": self.limit, "window_s": self.window_s, "keys": per_key,
                "span_s": (max(times) - min(times)) if times else 0.0,
                "arrivals": sum(len(k.arrivals) for k in self.keys.values()),
                "throttled": sum(k.throttled for k in self.keys.values()),
                "violations": sum(max(0, k.worst_window - self.limit)
                                  for k in self.keys.values())}

    async def handle(self, request: Request) -> Response:
        if request.method == "GET" and request.path.startswith("/q/"):
            return self.arrive(request.path[3:])
        if request.method == "GET" and request.path == "/_meter":
            return Response(200, json.dumps(self.report()).encode(), _JSON)
        return Response(404, b'{"error":"not found"}', _JSON)

    async def run(self, host: str = "127.0.0.1", port: int = 0, *,
                  task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await H11Server(self.handle).run(host, port, task_status=task_status)


async def _main(limit: int, window_s: float, port: int) -> None:
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(QuotaMeter(limit, window_s).run, "127.0.0.1", port)
        sys.stdout.write(f"{bound}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a quota-enforcing provider stand-in")
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--window", type=float, required=True, help="seconds")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    trio.run(_main, args.limit, args.window, args.port)
