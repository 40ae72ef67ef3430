"""The peer for ``bench/kernel.py``: the same no-op jobs through procrastinate on PostgreSQL.

``python -m bench.procrastinate_peer worker DSN CONCURRENCY`` runs one worker
process; the benchmark sets up the schema and defers the jobs itself.
"""

from __future__ import annotations

import asyncio
import sys

from procrastinate import App, PsycopgConnector


def make_app(dsn: str) -> App:
    app = App(connector=PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app


async def run_worker(dsn: str, concurrency: int) -> None:
    app = make_app(dsn)
    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency,
            wait=True,
            fetch_job_polling_interval=0.1,
            install_signal_handlers=True,
        )


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        asyncio.run(run_worker(sys.argv[2], int(sys.argv[3])))
