"""The CPU floor of one HTTP exchange on this machine, with the daemon's own parts.

    python -m bench.http_floor --requests 4000 --concurrency 32 [--pairs N --against REF]

Sends PATCHes through ``BoundedHttp`` (the client the effect runner and the receipt
sender use) to the sandbox's h11 server, first in the same process
(CPU per exchange, client and server together), then with the server in a
child process (the client's share alone: what integrationd pays per call).
Every effect needs two exchanges that cannot be batched (the provider PATCH
and the Runtime receipt), so this bounds effects/s per core from above.

With ``--pairs`` the pairs compare the client-only line (``http-floor.*``; the
same-process line is ``http-floor.with-server.*``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from multiprocessing.connection import Connection

import trio

from bench import pairs
from daemon.providers.executor import BoundedHttp
from sandbox.h11_server import H11Server, Request, Response


async def _ok(request: Request) -> Response:
    return Response(200, b'{"id":"1"}', (("content-type", "application/json"),))


async def _serve_forever(port_out: Connection) -> None:
    async with trio.open_nursery() as nursery:
        port: int = await nursery.start(H11Server(_ok).run)
        port_out.send(port)


def _child_server(port_out: Connection) -> None:
    trio.run(_serve_forever, port_out)


async def measure(requests: int, concurrency: int, port: int | None = None) -> dict[str, float]:
    async with trio.open_nursery() as nursery:
        if port is None:
            port = await nursery.start(H11Server(_ok).run)
        http = BoundedHttp.open(concurrency)
        url = f"http://127.0.0.1:{port}/crm/v3/objects/contacts/1"
        headers = {"authorization": "Bearer t", "content-type": "application/json"}
        per_worker = requests // concurrency

        async def worker() -> None:
            for _ in range(per_worker):
                await http.request("PATCH", url, timeout_s=10.0, headers=headers,
                                   content=b'{"properties":{"jobtitle":"x"}}')

        cpu, wall = time.process_time(), time.monotonic()
        async with trio.open_nursery() as workers:
            for _ in range(concurrency):
                workers.start_soon(worker)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        await http.aclose()
        nursery.cancel_scope.cancel()
    sent = per_worker * concurrency
    return {"exchanges": sent, "cpu_us_per_exchange": round(cpu / sent * 1e6, 1),
            "exchanges_per_s": round(sent / wall, 1),
            "exchanges_per_cpu_second": round(sent / cpu, 1)}


def main() -> None:
    pairs.delegate("bench.http_floor")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, metavar="N",
                        help="run as N interleaved pairs against --against (bench.pairs)")
    parser.add_argument("--against", metavar="REF", default="HEAD",
                        help="with --pairs: another checkout's directory or a commit")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    both = trio.run(measure, args.requests, args.concurrency)
    print(json.dumps({"system": "http-floor", "mode": "with-server",
                      "measured": "client and server, one process", **both}), flush=True)
    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=_child_server, args=(send,), daemon=True)
    server.start()
    try:
        client = trio.run(measure, args.requests, args.concurrency, receive.recv())
    finally:
        server.terminate()
        server.join()
    print(json.dumps({"system": "http-floor", "measured": "client only (server in a child)",
                      **client}), flush=True)


if __name__ == "__main__":
    main()
