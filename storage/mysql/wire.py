"""Reading result sets off the wire with less CPU than trio-mysql's own reader.

trio-mysql (like PyMySQL) reads a result set one packet at a time through several
Python calls per packet (two ``_read_bytes`` awaits, a ``struct.unpack``, a packet object)
and decodes it with several more per value: a row is a ``MysqlPacket`` whose every column
goes through ``read_length_coded_string`` -> ``read_length_encoded_integer`` ->
``read_uint8`` -> ``read``; a column descriptor is parsed in full (six strings and a
struct) for every column of every result set. The effect path's profile
(docs/performance.md, "Where the CPU of one effect goes") found that reading results was
the largest single part of the driver's cost.

This module keeps the driver's protocol and its decoding rules exactly, and only does the
same work in fewer calls:

* :meth:`FastConnection._read_payload`: when the whole packet is already in the
  receive buffer (nearly always: the driver asks the socket for up to 32 KiB at a time),
  it is sliced out directly, the sequence number checked as the driver does; otherwise,
  and for every packet of 16 MiB or more, the driver's own reader runs.
* column descriptors are parsed once per connection and distinct descriptor bytes (the
  same statement's columns describe themselves with the same bytes every time): the
  cached parse gives the same ``(encoding, converter)`` the driver would compute.
* rows are decoded by one loop over the packet's bytes (length-coded strings, NULL as
  0xFB), with the same per-column decoding and converter as the driver's.

An error packet raises through the driver's own ``raise_for_error``, as before; a row
shorter than its values raises a client-side "lost connection" error (the driver raised
an ``AssertionError``): either way the adapter closes that connection.
"""

from __future__ import annotations

from typing import Any

from trio_mysql import converters, err
from trio_mysql.connections import TEXT_TYPES, Connection, MySQLResult
from trio_mysql.constants import CR, FIELD_TYPE
from trio_mysql.protocol import FieldDescriptorPacket, MysqlPacket

# A packet this long continues in the next one: the driver's reader joins them.
_MAX_PACKET_LEN = 2**24 - 1
# Distinct column descriptors kept per connection (a schema's columns and the computed
# columns of our statements are far fewer); past it the cache starts over.
DESCRIPTOR_CACHE_MAX = 4096
_NULL = 251


class FastConnection(Connection):  # type: ignore[misc]
    """trio-mysql's connection with the faster result reader (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Descriptor bytes -> (the parsed descriptor, its description, encoding, converter).
        self._descriptors: dict[bytes, tuple[Any, Any, str | None, Any]] = {}

    async def _read_payload(self) -> bytes:
        """One packet's payload: sliced from the receive buffer when it is all there.
        An error packet raises, as the driver's reader does for every packet."""
        conn: Any = self  # the driver's attributes are untyped
        rbuf = conn._rbuf
        offset = conn._rbuf_offset
        if len(rbuf) - offset >= 4:
            length = rbuf[offset] | rbuf[offset + 1] << 8 | rbuf[offset + 2] << 16
            seq = conn._next_seq_id
            if (length < _MAX_PACKET_LEN and rbuf[offset + 3] == seq
                    and len(rbuf) - offset - 4 >= length):
                start = offset + 4
                conn._rbuf_offset = start + length
                conn._next_seq_id = (seq + 1) % 256
                data = bytes(rbuf[start:start + length])
                if data[:1] == b"\xff":
                    if self._result is not None and self._result.unbuffered_active is True:
                        self._result.unbuffered_active = False
                    MysqlPacket(data, self.encoding).raise_for_error()
                return data
        # A partial packet, a long one or a wrong sequence number: the driver's reader
        # (its errors, its joining of long packets, its error packets).
        packet = await Connection._read_packet(self, MysqlPacket)
        return bytes(packet.get_all_data())

    async def _read_packet(self, packet_type: Any = MysqlPacket) -> Any:
        return packet_type(await self._read_payload(), self.encoding)

    async def _read_query_result(self, unbuffered: bool = False) -> Any:
        if unbuffered:
            return await Connection._read_query_result(self, unbuffered=True)
        self._result = None
        result = FastResult(self)
        await result.read()
        self._result = result
        if result.server_status is not None:
            self.server_status = result.server_status
        rows: Any = result.affected_rows
        return rows

    def describe(self, data: bytes) -> tuple[Any, Any, str | None, Any]:
        """A column descriptor's parse, description, encoding and converter (cached)."""
        found = self._descriptors.get(data)
        if found is not None:
            return found
        field = FieldDescriptorPacket(data, self.encoding)
        field_type = field.type_code
        encoding: str | None
        # As MySQLResult._get_descriptions decides.
        if self.use_unicode:
            if field_type == FIELD_TYPE.JSON:
                encoding = self.encoding
            elif field_type in TEXT_TYPES:
                encoding = None if field.charsetnr == 63 else self.encoding
            else:
                encoding = "ascii"
        else:
            encoding = None
        converter = self.decoders.get(field_type)
        if converter is converters.through:
            converter = None
        if len(self._descriptors) >= DESCRIPTOR_CACHE_MAX:
            self._descriptors.clear()
        found = self._descriptors[data] = (field, field.description(), encoding, converter)
        return found


class FastResult(MySQLResult):  # type: ignore[misc]
    """A buffered result read by :class:`FastConnection` (module docstring)."""

    async def _read_result_packet(self, first_packet: Any) -> None:
        this: Any = self  # the driver's attributes are untyped
        conn = this.connection
        self.field_count = count = first_packet.read_length_encoded_integer()
        fields, description, decoding = [], [], []
        for _ in range(count):
            field, desc, encoding, converter = conn.describe(await conn._read_payload())
            fields.append(field)
            description.append(desc)
            decoding.append((encoding, converter))
        self.fields = fields
        self.converters = decoding
        self.description = tuple(description)
        eof = await conn._read_payload()
        assert eof[:1] == b"\xfe" and len(eof) < 9, "Protocol error, expecting EOF"
        rows = []
        while True:
            data = await conn._read_payload()
            if data[0] == 0xFE and len(data) < 9:  # EOF
                self._check_packet_is_eof(MysqlPacket(data, None))
                break
            rows.append(_decode_row(data, decoding))
        self.connection = None
        self.affected_rows = len(rows)
        self.rows = tuple(rows)


def _decode_row(data: bytes, decoding: list[tuple[str | None, Any]]) -> tuple[Any, ...]:
    """A text-protocol row: each column a length-coded string (0xFB: NULL), decoded and
    converted exactly as ``MySQLResult._read_row_from_packet`` does."""
    row: list[Any] = []
    pos = 0
    end = len(data)
    for encoding, converter in decoding:
        if pos >= end:  # fewer columns than described: the driver stops there too
            break
        c = data[pos]
        pos += 1
        if c < _NULL:
            length = c
        elif c == _NULL:
            row.append(None)
            continue
        elif c == 252:
            length = data[pos] | data[pos + 1] << 8
            pos += 2
        elif c == 253:
            length = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
            pos += 3
        elif c == 254:
            length = int.from_bytes(data[pos:pos + 8], "little")
            pos += 8
        else:  # 0xFF is no length: the driver reads it as NULL too
            row.append(None)
            continue
        value: Any = data[pos:pos + length]
        if len(value) != length:
            raise err.OperationalError(CR.CR_SERVER_LOST,
                                       "a row packet shorter than its values")
        pos += length
        if encoding is not None:
            value = value.decode(encoding)
        if converter is not None:
            value = converter(value)
        row.append(value)
    return tuple(row)
