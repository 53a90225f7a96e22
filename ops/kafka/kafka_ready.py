"""Exit 0 once a Kafka broker answers a Metadata request; standard library only.

`make kafka-up` runs this with the system Python before any virtualenv exists, so it speaks the
wire protocol itself: one Metadata v4 request (the oldest version Kafka 4.x still serves), and
the broker is ready when the response lists at least one broker.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time

METADATA_API_KEY = 3
METADATA_VERSION = 4
CORRELATION_ID = 0x5EED
CLIENT_ID = b"kafka-ready"
RETRY_INTERVAL_S = 0.5


def _metadata_request() -> bytes:
    body = struct.pack(">hhih", METADATA_API_KEY, METADATA_VERSION, CORRELATION_ID, len(CLIENT_ID))
    # topics = null (all topics), allow_auto_topic_creation = false
    body += CLIENT_ID + struct.pack(">ib", -1, 0)
    return struct.pack(">i", len(body)) + body


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def broker_count(host: str, port: int, timeout_s: float) -> int:
    """Send one Metadata request and return how many brokers the response lists."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(_metadata_request())
        (size,) = struct.unpack(">i", _read_exact(sock, 4))
        response = _read_exact(sock, size)
    correlation_id, _throttle_ms, brokers = struct.unpack(">iii", response[:12])
    if correlation_id != CORRELATION_ID:
        raise ConnectionError(f"unexpected correlation id {correlation_id}")
    return int(brokers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--bootstrap", default="127.0.0.1:9092", help="host:port (default: %(default)s)"
    )
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait (default: %(default)s)"
    )
    args = parser.parse_args()
    host, _, port = args.bootstrap.rpartition(":")
    deadline = time.monotonic() + args.timeout
    last_error = "no attempt"
    while time.monotonic() < deadline:
        try:
            if broker_count(host, int(port), timeout_s=2.0) > 0:
                return 0
            last_error = "metadata lists no broker yet"
        except (OSError, ConnectionError, struct.error) as exc:
            last_error = str(exc)
        time.sleep(RETRY_INTERVAL_S)
    print(
        f"kafka not ready at {args.bootstrap} after {args.timeout:.0f}s: {last_error}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
