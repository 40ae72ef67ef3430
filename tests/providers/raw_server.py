"""A loopback server that misbehaves on purpose: each accepted connection (TCP, or TLS
with the given context) is handed to a behaviour, a coroutine that reads requests and
writes whatever bytes it wants."""

from __future__ import annotations

import datetime
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Behaviour = Callable[["Conn"], Awaitable[None]]


@attrs.define(eq=False)
class Conn:
    stream: trio.abc.Stream
    buffer: bytearray = attrs.field(factory=bytearray)

    async def read_request(self) -> bytes:
        """One whole request (head and Content-Length body), or b"" at EOF."""
        while b"\r\n\r\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                return b""
            self.buffer.extend(data)
        head, _, rest = bytes(self.buffer).partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        self.buffer[:] = rest
        while len(self.buffer) < length:
            self.buffer.extend(await self.stream.receive_some(65536))
        del self.buffer[:length]
        return head

    async def answer(self, body: bytes = b'{"id":"42"}', *extra: bytes) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        head += b"".join(h + b"\r\n" for h in extra)
        await self.stream.send_all(head + b"content-length: %d\r\n\r\n" % len(body) + body)


@attrs.define(eq=False)
class RawServer:
    behaviour: Behaviour
    tls: ssl.SSLContext | None = None
    accepted: int = 0
    heads: list[bytes] = attrs.field(factory=list)

    async def serve(self, nursery: trio.Nursery) -> int:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port: int = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, self._handle, listeners)
        return port

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        wrapped: trio.abc.Stream = stream
        try:
            if self.tls is not None:
                wrapped = trio.SSLStream(stream, self.tls, server_side=True)
                await wrapped.do_handshake()
            await self.behaviour(Conn(wrapped))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(wrapped)


def tls_pair() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate for localhost, and a client
    context that trusts exactly that certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory() as folder:  # the ssl module loads keys from files
        cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_file.write_bytes(pem)
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cadata=pem.decode())
    return server, client
