"""A real TCP proxy in front of MariaDB that can fail on purpose.

* ``refuse()``: drop every open connection and refuse new ones (the database
  "goes away"); ``restore()`` lets connections through again.
* ``cut_after_next_commit()``: forward the next ``COMMIT`` to the server, let
  the server run it, then cut the connection before the reply reaches the
  client: a COMMIT whose outcome the client cannot know. With
  ``refuse_for=S`` the proxy then also refuses connections for S seconds (the
  server is still going away, as in a restart), so the client's read-back
  fails a few times before it succeeds.
* ``freeze()``: a *hung* database, as when the server process is stopped
  (SIGSTOP): connections stay open and new ones are accepted (the kernel would
  complete the TCP handshake), but nothing is forwarded either way, so no
  greeting, reply or COMMIT answer ever arrives; ``thaw()`` forwards again
  (what was held is delivered then). ``frozen_bytes`` counts what was held.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from storage.mysql.adapter import MysqlTarget
from tests.support.backends import FreshDatabase, fresh_database

_COM_QUERY_COMMIT = b"\x03COMMIT"


@attrs.define(eq=False)
class ChaosProxy:
    upstream_host: str
    upstream_port: int
    port: int = 0
    refusing: bool = False
    cut_armed: bool = False
    cuts: int = 0
    refuse_after_cut_s: float = 0.0
    refused: int = 0
    frozen_bytes: int = 0
    _streams: set[trio.SocketStream] = attrs.field(factory=set)
    _thawed: trio.Event | None = None

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    def refuse(self) -> None:
        self.refusing = True
        for stream in list(self._streams):
            stream.socket.close()
        self._streams.clear()

    def restore(self) -> None:
        self.refusing = False

    def freeze(self) -> None:
        if self._thawed is None:
            self._thawed = trio.Event()

    def thaw(self) -> None:
        if self._thawed is not None:
            self._thawed.set()
            self._thawed = None

    @property
    def frozen(self) -> bool:
        return self._thawed is not None

    async def _hold_while_frozen(self, data: bytes = b"") -> None:
        while self._thawed is not None:
            self.frozen_bytes += len(data)
            data = b""
            await self._thawed.wait()

    def cut_after_next_commit(self, refuse_for: float = 0.0) -> None:
        self.cut_armed = True
        self.refuse_after_cut_s = refuse_for

    async def _refuse_a_while(self, seconds: float) -> None:
        self.refuse()
        await trio.sleep(seconds)
        self.restore()

    async def _handle(self, client: trio.SocketStream) -> None:
        if self.refusing:
            self.refused += 1
            await client.aclose()
            return
        await self._hold_while_frozen()  # accepted, but the "server" never greets
        try:
            server = await trio.open_tcp_stream(self.upstream_host, self.upstream_port)
        except OSError:
            await client.aclose()
            return
        self._streams.update((client, server))
        down = trio.CancelScope()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._upstream, client, server, down, nursery.cancel_scope)
                nursery.start_soon(self._downstream, server, client, down, nursery.cancel_scope)
        finally:
            for s in (client, server):
                self._streams.discard(s)
                s.socket.close()

    async def _upstream(self, client: trio.SocketStream, server: trio.SocketStream,
                        down: trio.CancelScope, scope: trio.CancelScope) -> None:
        try:
            while True:
                data = await client.receive_some(65536)
                if not data:
                    break
                await self._hold_while_frozen(data)
                if self.cut_armed and _COM_QUERY_COMMIT in data:
                    self.cut_armed = False
                    self.cuts += 1
                    down.cancel()  # the reply must never reach the client
                    await server.send_all(data)
                    await trio.sleep(0.3)  # let the server run the COMMIT
                    if self.refuse_after_cut_s:
                        # Refuse from now on (this connection included) for a while.
                        self.refusing = True
                        trio.lowlevel.spawn_system_task(
                            self._refuse_a_while, self.refuse_after_cut_s)
                    break
                await server.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    async def _downstream(self, server: trio.SocketStream, client: trio.SocketStream,
                          down: trio.CancelScope, scope: trio.CancelScope) -> None:
        with down:
            try:
                while True:
                    data = await server.receive_some(65536)
                    if not data:
                        break
                    await self._hold_while_frozen(data)
                    await client.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            scope.cancel()


@attrs.frozen
class Proxied:
    """A fresh MariaDB database, a proxy in front of it, and the URL through the proxy."""

    database: FreshDatabase
    proxy: ChaosProxy
    url: str


@asynccontextmanager
async def proxied_mysql(tmp_path: Path, *, migrated: bool = True) -> AsyncIterator[Proxied]:
    async with fresh_database("mysql", tmp_path, migrated=migrated) as tdb, \
            trio.open_nursery() as nursery:
        target = MysqlTarget.from_url(tdb.url)
        proxy = ChaosProxy(target.host, target.port)
        port = await nursery.start(proxy.run)
        yield Proxied(tdb, proxy,
                      f"mysql://{target.user}@127.0.0.1:{port}/{target.database}")
        proxy.thaw()
        nursery.cancel_scope.cancel()
