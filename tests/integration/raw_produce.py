"""A minimal Kafka producer that writes record bytes exactly as given, for hostile-input tests.

Real clients refuse to write what an attacker can: librdkafka encodes header keys from Python
strings, so a header key that is not valid UTF-8 cannot be produced through it. This module
speaks the wire protocol itself (Produce v3, one uncompressed record batch v2, acks=all) to a
single-node broker, so tests can put arbitrary bytes in keys, values and header keys.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

#: One record: key, value, headers (key bytes, value bytes).
RawRecord = tuple[bytes | None, bytes | None, Sequence[tuple[bytes, bytes | None]]]

_PRODUCE, _PRODUCE_VERSION = 0, 3


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of record batch v2."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        bits = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _sized(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


def _record(offset_delta: int, record: RawRecord) -> bytes:
    key, value, headers = record
    body = b"\x00" + _varint(0) + _varint(offset_delta) + _sized(key) + _sized(value)
    body += _varint(len(headers))
    for header_key, header_value in headers:
        body += _varint(len(header_key)) + header_key + _sized(header_value)
    return _varint(len(body)) + body


def record_batch(records: Sequence[RawRecord], timestamp_ms: int) -> bytes:
    """An uncompressed record batch (magic 2) holding `records`, without a producer id."""
    body = struct.pack(">hiqqqhi", 0, len(records) - 1, timestamp_ms, timestamp_ms, -1, -1, -1)
    body += struct.pack(">i", len(records))
    body += b"".join(_record(i, r) for i, r in enumerate(records))
    after_length = struct.pack(">ib", -1, 2) + struct.pack(">I", crc32c(body)) + body
    return struct.pack(">qi", 0, len(after_length)) + after_length


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def produce_raw(bootstrap: str, topic: str, partition: int, records: Sequence[RawRecord]) -> int:
    """Write `records` to `topic`/`partition` of a single-node broker; return the base offset.

    Raises RuntimeError with the broker's error code when it refuses the batch.
    """
    batch = record_batch(records, time.time_ns() // 1_000_000)
    body = struct.pack(">hhih", _PRODUCE, _PRODUCE_VERSION, 1, -1)  # header: no client id
    body += struct.pack(">hhi", -1, -1, 30_000)  # no transactional id, acks=all, timeout
    body += struct.pack(">i", 1) + _string(topic)
    body += struct.pack(">ii", 1, partition) + struct.pack(">i", len(batch)) + batch
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _read(conn, 4))[0]
        response = _read(conn, size)
    # correlation id, topics array (1), topic name, partitions array (1), index, error, offset
    name_length = struct.unpack_from(">h", response, 8)[0]
    at = 10 + name_length + 4
    _index, error, base_offset = struct.unpack_from(">ihq", response, at)
    if error:
        raise RuntimeError(f"broker refused the batch: Kafka error code {error}")
    return int(base_offset)


def _read(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise RuntimeError("broker closed the connection")
        data += chunk
    return bytes(data)
