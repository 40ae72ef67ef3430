"""Hypercorn on the virtual network: the replacement for ``http_server.serve_with``.

Production binds a kernel socket and hands it to hypercorn as ``fd://``, which no socket
factory sees. Here the listener is opened through ``trio.open_tcp_listeners`` (so the
virtual network's factory makes it), the app runs its ASGI lifespan as hypercorn's own
worker does, and every accepted stream goes to hypercorn's per-connection ``TCPServer``:
the same protocol code and the same ASGI apps as in production.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from daemon.services import http_server


async def serve_virtual(app: Any, config: Config, listen: str, name: str | None,
                        task_status: trio.TaskStatus[list[str]]) -> None:
    host, _, port_text = listen.rpartition(":")
    try:
        listeners = await trio.open_tcp_listeners(int(port_text), host=host.strip("[]"))
    except OSError as exc:
        raise http_server.ListenerError(listen, str(exc), name) from None
    wrapped = wrap_app(app, config.wsgi_max_body_size, None)
    state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, config, state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        address = listeners[0].socket.getsockname()
        async with trio.open_nursery() as connections:
            task_status.started([f"http://{address[0]}:{address[1]}"])
            # Serves until cancelled (the replica's or the part's scope).
            await trio.serve_listeners(
                partial(TCPServer, wrapped, config, context, ConnectionState(state.copy())),
                listeners, handler_nursery=connections)


def install() -> None:
    http_server.serve_with = serve_virtual
