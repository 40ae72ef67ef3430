"""The virtual network: in-memory TCP installed through trio's socket hooks.

Theory of operation
-------------------
:meth:`VirtualNetwork.install` sets trio's custom socket factory and hostname
resolver for the current run, so everything that opens sockets through
``trio.socket`` (our HTTP client, httpx/httpcore's trio backend,
``trio.open_tcp_listeners`` in the sandbox's h11 servers, the seam in
``daemon/services/http_server.py``) gets a
:class:`VirtualSocket` instead of a kernel socket. Nothing above changes.

A connection is two byte pipes. Every socket belongs to a *node* (a replica, a
simulator, the Runtime): the node is read from :data:`NODE`, a context variable the
world sets once in each part's root task (trio copies it into child tasks), so a
partition or a crash can name the sockets it affects without the code above knowing.

Faults are decided at *exchange* boundaries: the first write of a client after it
connected or after it read something is the start of a request, and the network's
:class:`NetFaults` (drawn from the seed) decides its fate there:

* ``refuse``: the connect fails (``ECONNREFUSED``);
* ``delay``: the bytes arrive after a seeded delay;
* ``drop_request``: the request never reaches the server; the client sees a reset;
* ``reset_mid_body``: part of the request arrives, then both sides see a reset;
* ``lose_answer``: the request arrives and is handled; the server's answer is lost
  and the client sees a reset (the ambiguous outcome the effect journal exists for);
* ``slow_reader``: the client reads its answer slowly (each read waits);
* partitions: a connect between two partitioned nodes fails, and live connections
  between them are reset when the partition begins.

Freezing a node (:meth:`freeze`) parks every socket operation of that node until
it is thawed; killing one (:meth:`kill_node`) resets its connections and makes every
later operation of its old sockets fail, as a SIGKILL would.
"""

from __future__ import annotations

import contextvars
import errno
import os
import socket as stdlib_socket
import struct
from collections.abc import Callable
from typing import Any

import attrs
import trio

ANY = "0.0.0.0"  # noqa: S104 (a name on the virtual network, never bound)
NODE: contextvars.ContextVar[str] = contextvars.ContextVar("sim_node", default="world")

Trace = Callable[..., None]
_LINGER_RST = struct.pack("ii", 1, 0)


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


@attrs.define
class NetFaults:
    """Per-exchange fault probabilities (each seed draws its own: swarm testing)."""

    refuse: float = 0.0
    delay: float = 0.0
    drop_request: float = 0.0
    reset_mid_body: float = 0.0
    lose_answer: float = 0.0
    slow_reader: float = 0.0
    max_delay_s: float = 1.5

    def kinds(self) -> list[tuple[str, float]]:
        return [("refuse", self.refuse), ("delay", self.delay),
                ("drop_request", self.drop_request), ("reset_mid_body", self.reset_mid_body),
                ("lose_answer", self.lose_answer), ("slow_reader", self.slow_reader)]


class _Pipe:
    """Bytes flowing one way, with EOF and reset."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.eof = False
        self.reset = False
        self.changed = trio.Event()

    def wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class VirtualSocket(trio.socket.SocketType):
    def __init__(self, net: VirtualNetwork, family: int, type_: int, proto: int,
                 node: str) -> None:
        self._net = net
        self._family = stdlib_socket.AddressFamily(family or stdlib_socket.AF_INET)
        self._type = stdlib_socket.SocketKind(type_ or stdlib_socket.SOCK_STREAM)
        if self._type != stdlib_socket.SOCK_STREAM:
            raise NotImplementedError("the virtual network carries TCP only")
        self._proto = proto
        self.node = node
        self.fd = net.next_fd()
        self._closed = False
        self._shut_wr = False
        self._options: dict[tuple[int, int], Any] = {}
        self.local: tuple[str, int] | None = None
        self.peer_address: tuple[str, int] | None = None
        self.peer: VirtualSocket | None = None
        self.incoming: _Pipe | None = None
        self.outgoing: _Pipe | None = None
        self.is_client = False
        self.turn = True  # the next write of a client starts an exchange
        self.drop_next_answer = False
        self.slow = False
        self.delay_s = 0.0
        self.dead = False
        # Frozen on the way out of this exchange (between its last check and write()).
        self.froze_at_send = False
        self._listening = False
        self._backlog: trio.MemoryReceiveChannel[VirtualSocket] | None = None
        self._backlog_send: trio.MemorySendChannel[VirtualSocket] | None = None

    # ---------------------------------------------------------------- plumbing
    @property
    def family(self) -> stdlib_socket.AddressFamily:
        return self._family

    @property
    def type(self) -> stdlib_socket.SocketKind:
        return self._type

    @property
    def proto(self) -> int:
        return self._proto

    @property
    def did_shutdown_SHUT_WR(self) -> bool:
        return self._shut_wr

    def __repr__(self) -> str:
        return f"<VirtualSocket {self.node} {self.local}->{self.peer_address}>"

    def fileno(self) -> int:
        return -1 if self._closed else self.fd

    def setsockopt(self, level: int, option: int, value: Any, length: int | None = None
                   ) -> None:
        self._options[(level, option)] = value

    def getsockopt(self, level: int, option: int, buflen: int | None = None) -> Any:
        if (level, option) == (stdlib_socket.SOL_SOCKET, stdlib_socket.SO_ACCEPTCONN):
            return int(self._listening)
        return self._options.get((level, option), 0)

    def getsockname(self) -> tuple[str, int]:
        return self.local or (ANY, 0)

    def getpeername(self) -> tuple[str, int]:
        if self.peer_address is None:
            raise _err(errno.ENOTCONN)
        return self.peer_address

    def __enter__(self) -> VirtualSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_readable(self) -> bool:
        pipe = self.incoming
        return pipe is None or bool(pipe.buffer) or pipe.eof or pipe.reset

    async def wait_writable(self) -> None:
        await trio.lowlevel.checkpoint()

    def shutdown(self, flag: int) -> None:
        if flag in (stdlib_socket.SHUT_WR, stdlib_socket.SHUT_RDWR) and self.outgoing:
            self._shut_wr = True
            self.outgoing.eof = True
            self.outgoing.wake()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._listening and self.local is not None:
            if self._net.listeners.get(self.local) is self:
                del self._net.listeners[self.local]
            if self._backlog_send is not None:
                self._backlog_send.close()
        linger = self._options.get((stdlib_socket.SOL_SOCKET, stdlib_socket.SO_LINGER))
        if linger == _LINGER_RST:  # SO_LINGER (1, 0): close() sends RST
            self.reset()
        if self.outgoing is not None:
            self.outgoing.eof = True
            self.outgoing.wake()
        if self.incoming is not None:
            # Unread bytes left at close: the kernel answers with RST.
            if self.incoming.buffer and not self.incoming.eof and self.outgoing is not None:
                self.outgoing.reset = True
                self.outgoing.wake()
            self.incoming.wake()
        self._net.connections.discard(self)

    def reset(self) -> None:
        for pipe in (self.incoming, self.outgoing):
            if pipe is not None:
                pipe.reset = True
                pipe.wake()

    # ---------------------------------------------------------------- listen
    async def bind(self, address: Any) -> None:
        await trio.lowlevel.checkpoint()
        host, port = address[0], int(address[1])
        host = self._net.resolve(host)
        if port == 0:
            port = self._net.next_port()
        if (host, port) in self._net.listeners:
            raise _err(errno.EADDRINUSE)
        self.local = (host, port)

    def listen(self, backlog: int = 128) -> None:
        if self.local is None:
            raise _err(errno.EINVAL)
        if self.local in self._net.listeners:
            raise _err(errno.EADDRINUSE)
        self._listening = True
        self._backlog_send, self._backlog = trio.open_memory_channel(float("inf"))
        self._net.listeners[self.local] = self

    async def accept(self) -> tuple[VirtualSocket, tuple[str, int]]:
        if self._backlog is None:
            raise _err(errno.EINVAL)
        try:
            sock = await self._backlog.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise _err(errno.EBADF) from None
        assert sock.peer_address is not None
        return sock, sock.peer_address

    # ---------------------------------------------------------------- connect
    async def connect(self, address: Any) -> None:
        host, port = self._net.resolve(address[0]), int(address[1])
        self.froze_at_send = await self._net.gate(self.node)
        listener = self._net.listeners.get((host, port))
        if listener is None or listener.dead:
            await trio.lowlevel.checkpoint()
            raise ConnectionRefusedError(errno.ECONNREFUSED, "connection refused (virtual)")
        if self._net.partitioned(self.node, listener.node):
            await trio.sleep(0.5)
            self._net.count("partition_refused")
            raise _err(errno.EHOSTUNREACH)
        if self._net.draw("refuse", self.node, listener.node, (host, port)):
            await trio.lowlevel.checkpoint()
            raise ConnectionRefusedError(errno.ECONNREFUSED, "connection refused (fault)")
        server = VirtualSocket(self._net, self._family, self._type, self._proto, listener.node)
        up, down = _Pipe(), _Pipe()
        self.outgoing, self.incoming = up, down
        server.incoming, server.outgoing = up, down
        self.peer, server.peer = server, self
        self.local = ("10.0.0.1", self._net.next_port())
        self.peer_address = (host, port)
        server.local, server.peer_address = (host, port), self.local
        self.is_client = True
        self._net.connections.add(self)
        self._net.connections.add(server)
        assert listener._backlog_send is not None
        listener._backlog_send.send_nowait(server)
        await trio.lowlevel.checkpoint()

    # ---------------------------------------------------------------- bytes
    async def send(self, data: Any, flags: int = 0) -> int:
        if await self._net.gate(self.node) and self.turn:
            self.froze_at_send = True
        data = bytes(data)
        pipe = self.outgoing
        if self._closed:
            raise _err(errno.EBADF)
        if pipe is None:
            raise _err(errno.ENOTCONN)
        if pipe.reset or self.dead:
            raise ConnectionResetError(errno.ECONNRESET, "connection reset (virtual)")
        if pipe.eof:
            raise BrokenPipeError(errno.EPIPE, "broken pipe (virtual)")
        if self.is_client and self.turn and data:
            self.turn = False
            self._net.on_exchange(self, data)
            fate = self._net.exchange_fate(self)
            if fate == "drop_request":
                self.reset()
                raise ConnectionResetError(errno.ECONNRESET, "connection reset (fault)")
            if fate == "reset_mid_body":
                pipe.buffer += data[: len(data) // 2]
                self.reset()
                return len(data)
            if fate == "lose_answer" and self.peer is not None:
                self.peer.drop_next_answer = True
            if fate == "slow_reader":
                self.slow = True
            if fate == "delay":
                self.delay_s = self._net.rng.uniform(0.01, self._net.faults.max_delay_s)
        if not self.is_client and self.drop_next_answer and data:
            # The request was handled; its answer vanishes and the client sees a reset.
            self.drop_next_answer = False
            self.reset()
            return len(data)
        if self.delay_s:
            delay, self.delay_s = self.delay_s, 0.0
            await trio.sleep(delay)
            if pipe.reset:
                raise ConnectionResetError(errno.ECONNRESET, "connection reset (virtual)")
        pipe.buffer += data
        pipe.wake()
        await trio.lowlevel.checkpoint()
        return len(data)

    async def recv(self, buflen: int, flags: int = 0) -> bytes:
        await self._net.gate(self.node)
        pipe = self.incoming
        if self._closed:
            raise _err(errno.EBADF)
        if pipe is None:
            raise _err(errno.ENOTCONN)
        if self.slow:
            await trio.sleep(self._net.rng.uniform(0.05, 0.5))
        while True:
            if pipe.reset or self.dead:
                raise ConnectionResetError(errno.ECONNRESET, "connection reset (virtual)")
            if pipe.buffer:
                chunk = bytes(pipe.buffer[:buflen])
                del pipe.buffer[:buflen]
                if self.is_client:
                    self.turn = True
                    self.slow = False
                    self.froze_at_send = False
                await trio.lowlevel.checkpoint()
                return chunk
            if pipe.eof:
                await trio.lowlevel.checkpoint()
                return b""
            if self._closed:
                raise _err(errno.EBADF)
            await pipe.changed.wait()
            await self._net.gate(self.node)


@attrs.frozen
class _Factory(trio.abc.SocketFactory):
    net: VirtualNetwork

    def socket(self, family: int | None = None, type: int | None = None,
               proto: int | None = None) -> trio.socket.SocketType:
        return VirtualSocket(self.net, family or stdlib_socket.AF_INET,
                             type or stdlib_socket.SOCK_STREAM, proto or 0, NODE.get())


@attrs.frozen
class _Resolver(trio.abc.HostnameResolver):
    net: VirtualNetwork

    async def getaddrinfo(self, host: bytes | str | None, port: bytes | str | int | None,
                          family: int = 0, type: int = 0, proto: int = 0,
                          flags: int = 0) -> list[Any]:
        await trio.lowlevel.checkpoint()
        name = host.decode() if isinstance(host, bytes) else host
        ip = self.net.resolve(name or ANY)
        number = int(port.decode() if isinstance(port, bytes) else (port or 0))
        return [(stdlib_socket.AF_INET, stdlib_socket.SOCK_STREAM, stdlib_socket.IPPROTO_TCP,
                 "", (ip, number))]

    async def getnameinfo(self, sockaddr: Any, flags: int) -> tuple[str, str]:
        await trio.lowlevel.checkpoint()
        return str(sockaddr[0]), str(sockaddr[1])


class VirtualNetwork:
    """One address space (every host name is 127.0.0.1), nodes, partitions, faults."""

    def __init__(self, rng: Any, faults: NetFaults, trace: Trace,
                 count: Callable[[str], None]) -> None:
        self.rng = rng
        self.faults = faults
        self.trace = trace
        self.count = count
        self.listeners: dict[tuple[str, int], VirtualSocket] = {}
        self.connections: set[VirtualSocket] = set()
        self._port = 20000
        self._fd = 1000
        self._partitions: set[frozenset[str]] = set()
        self._frozen: dict[str, trio.Event] = {}
        self.protected: set[str] = set()  # nodes whose exchanges are never faulted
        self.enabled = True
        # Called at the instant a client's request starts to leave (the oracles' hook).
        self.on_exchange: Callable[[VirtualSocket, bytes], None] = lambda sock, data: None

    def install(self) -> None:
        trio.socket.set_custom_socket_factory(_Factory(self))
        trio.socket.set_custom_hostname_resolver(_Resolver(self))

    def next_port(self) -> int:
        self._port += 1
        return self._port

    def next_fd(self) -> int:
        self._fd += 1
        return self._fd

    @staticmethod
    def resolve(host: str) -> str:
        return "127.0.0.1" if host in ("localhost", ANY, "", "::", "::1") else host

    # ---------------------------------------------------------------- faults
    def draw(self, kind: str, src: str, dst: str, where: object) -> bool:
        if not self.enabled or src in self.protected or dst in self.protected:
            return False
        p = dict(self.faults.kinds())[kind]
        if p and self.rng.random() < p:
            self.count(f"net.{kind}")
            self.trace("fault", fault=f"net.{kind}", src=src, dst=dst)
            return True
        return False

    def exchange_fate(self, client: VirtualSocket) -> str:
        dst = client.peer.node if client.peer is not None else "?"
        for kind, _ in self.faults.kinds():
            if kind != "refuse" and self.draw(kind, client.node, dst, client.peer_address):
                return kind
        return "ok"

    def partitioned(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self._partitions

    def partition(self, a: str, b: str) -> None:
        self._partitions.add(frozenset((a, b)))
        for sock in sorted(self.connections, key=lambda s: s.fd):
            peer = sock.peer
            if peer is not None and {sock.node, peer.node} == {a, b}:
                sock.reset()

    def heal(self, a: str, b: str) -> None:
        self._partitions.discard(frozenset((a, b)))

    # ---------------------------------------------------------------- processes
    async def gate(self, node: str) -> bool:
        """A frozen node's socket operations wait here until it is thawed (True: it did)."""
        frozen = self._frozen.get(node)
        if frozen is None:
            return False
        await frozen.wait()
        return True

    def freeze(self, node: str) -> None:
        self._frozen.setdefault(node, trio.Event())

    def thaw(self, node: str) -> None:
        event = self._frozen.pop(node, None)
        if event is not None:
            event.set()

    def kill_node(self, node: str) -> None:
        """A SIGKILL: every socket of ``node`` is dead, its peers see resets."""
        for sock in sorted(self.connections, key=lambda s: s.fd):
            if sock.node == node:
                sock.dead = True
                sock.reset()
        for address, listener in sorted(self.listeners.items()):
            if listener.node == node:
                listener.dead = True
                listener.close()
                self.listeners.pop(address, None)
