"""Serve an ASGI app with hypercorn on trio; report the bound address when ready."""

from __future__ import annotations

import logging

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio


async def serve_app(
    app: QuartTrio,
    listen: str,
    *,
    graceful_timeout_s: float = 5.0,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``listen`` (``host:port``; port 0 picks one) until cancelled."""
    config = Config()
    config.bind = [listen]
    config.accesslog = None
    config.errorlog = logging.getLogger("integrationd.http")
    config.graceful_timeout = graceful_timeout_s
    config.include_server_header = False

    async def hypercorn_serve(
        *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await serve(app, config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        bound: list[str] = await nursery.start(hypercorn_serve)
        task_status.started(bound[0] if bound else listen)
