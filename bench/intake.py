"""The command intake's CPU per command: ``POST /v1/commands/batch`` on MariaDB.

    python -m bench.intake [--batches 80 --batch 25] [--pairs 4 --against main]

One process: the service API (the real app, served by hypercorn on loopback, admitting
into a fresh MariaDB database) runs in the main thread's trio loop; an httpx client in
a second thread sends ``--batches`` requests of ``--batch`` fresh commands each (one
lead per command, as the effects benchmark's Runtime does). The figure is the CPU time
of the server's thread alone (``time.thread_time`` read inside it before and after),
per command admitted: validation, the admission transaction, the answer, the HTTP
server's share. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from bench import pairs
from bench.kernel import fresh_url, mysql_admin
from config.catalog import load_catalog
from daemon.api.app import ApiContext, create_api_app
from daemon.core.canonical import canonical_digest
from daemon.core.handoff import EffectHandoffKey
from daemon.services.catalog_view import CatalogView, publish_current
from daemon.services.clock import WallClock
from daemon.services.http_server import serve_app
from storage.migrate import migrate
from storage.open import open_store
from tests.support.commands import command_doc
from tests.support.slice import RUNTIME_TOKEN, SCOPE, slice_settings


def _entry(n: int, revision: int) -> dict[str, Any]:
    intent = f"int-{os.getpid()}-{n}"
    command = command_doc(intent, title=f"Title {n}", lead=f"lead-{n}")
    command["catalog_revision"] = revision
    return {"effect_handoff_key": EffectHandoffKey(SCOPE, intent).encode(),
            "payload_digest": canonical_digest(command), "runtime_outbox_id": f"ob-{n}",
            "command": command}


def _client(address: str, token: trio.lowlevel.TrioToken, bodies: list[bytes],
            warmup: int, out: dict[str, float]) -> None:
    """The client thread (a blocking client: no trio run of its own, so it may read the
    server thread's clock through ``trio.from_thread``): ``warmup`` requests, then the
    measured ones."""
    headers = {"Authorization": f"Bearer {RUNTIME_TOKEN}", "Content-Type": "application/json"}
    with httpx.Client(base_url=address, timeout=60) as client:
        for i, body in enumerate(bodies):
            if i == warmup:
                out["cpu_before"] = trio.from_thread.run_sync(time.thread_time,
                                                              trio_token=token)
                out["wall_before"] = time.monotonic()
            answer = client.post("/v1/commands/batch", content=body, headers=headers)
            results = answer.json()["results"]
            if answer.status_code != 200 or any(r["status"] != 200 for r in results):
                raise SystemExit(f"refused: {answer.text[:300]}")
        out["cpu_after"] = trio.from_thread.run_sync(time.thread_time, trio_token=token)
        out["wall_after"] = time.monotonic()


async def measure(url: str, batches: int, batch: int, warmup: int) -> dict[str, Any]:
    store = await open_store(url)
    await migrate(store.db, store.dialect, WallClock().now_us())
    settings = slice_settings(api_port=0, runtime_url="http://127.0.0.1:9",
                              hubspot_url="http://127.0.0.1:9", url=url)
    catalog = load_catalog(settings)
    await publish_current(store, catalog, actor="bench", role="admin", reason="bench.intake",
                          now_us=WallClock().now_us())
    app = create_api_app(ApiContext(settings=settings, store=store, catalog=catalog,
                                    clock=WallClock(), catalogs=CatalogView(store, catalog)))
    bodies = [json.dumps({"commands": [_entry(b * batch + i, catalog.revision)
                                       for i in range(batch)]}).encode()
              for b in range(warmup + batches)]
    out: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_app, app, "127.0.0.1:0")
        thread = threading.Thread(target=_client, args=(address, trio.lowlevel.current_trio_token(),
                                                        bodies, warmup, out))
        thread.start()
        await trio.to_thread.run_sync(thread.join)
        nursery.cancel_scope.cancel()
    await store.db.aclose()
    if "cpu_after" not in out:
        raise SystemExit("the client thread failed")
    commands = batches * batch
    return {"cpu_us_per_command": round(1e6 * (out["cpu_after"] - out["cpu_before"]) / commands,
                                        1),
            "commands_per_s": round(commands / (out["wall_after"] - out["wall_before"]), 1)}


def main() -> None:
    pairs.delegate("bench.intake")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, metavar="N",
                        help="run as N interleaved pairs against --against (bench.pairs)")
    parser.add_argument("--against", metavar="REF", default="HEAD",
                        help="with --pairs: another checkout's directory or a commit")
    parser.add_argument("--batches", type=int, default=80)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url, name = fresh_url("mysql", Path(tmp))
        try:
            figures = trio.run(measure, url, args.batches, args.batch, args.warmup)
        finally:
            if name is not None:
                mysql_admin(f"DROP DATABASE IF EXISTS {name}")
    print(json.dumps({"system": "integrationd-intake", "backend": "mysql",
                      "batches": args.batches, "batch": args.batch, **figures}))


if __name__ == "__main__":
    main()
