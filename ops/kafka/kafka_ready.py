"""Exit 0 once a Kafka broker answers a Metadata request; standard library only.

`make kafka-up` runs this with the system Python before any virtualenv exists, so it speaks the
wire protocol itself: one Metadata v4 request (the oldest version Kafka 4.x still serves) on a
plaintext listener, and the broker is ready when the response lists at least one broker. The
secured broker's check (TLS and SASL, as its clients connect) is `secure_ready.py`, run with the
virtualenv's confluent-kafka.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import time
from collections.abc import Callable

METADATA_API_KEY = 3
METADATA_VERSION = 4
CORRELATION_ID = 0x5EED
CLIENT_ID = b"kafka-ready"
RETRY_INTERVAL_S = 0.5


def _request(api_key: int, version: int, body: bytes) -> bytes:
    header = struct.pack(">hhih", api_key, version, CORRELATION_ID, len(CLIENT_ID)) + CLIENT_ID
    return struct.pack(">i", len(header) + len(body)) + header + body


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def _call(sock: socket.socket, api_key: int, version: int, body: bytes) -> bytes:
    """Send one request and return the response body (after the correlation id)."""
    sock.sendall(_request(api_key, version, body))
    (size,) = struct.unpack(">i", _read_exact(sock, 4))
    response = _read_exact(sock, size)
    (correlation_id,) = struct.unpack(">i", response[:4])
    if correlation_id != CORRELATION_ID:
        raise ConnectionError(f"unexpected correlation id {correlation_id}")
    return response[4:]


def broker_count(host: str, port: int, timeout_s: float) -> int:
    """Send one Metadata request and return how many brokers it lists."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        # topics = null (all topics), allow_auto_topic_creation = false
        response = _call(sock, METADATA_API_KEY, METADATA_VERSION, struct.pack(">ib", -1, 0))
    _throttle_ms, brokers = struct.unpack(">ii", response[:8])
    return int(brokers)


def wait_for_brokers(
    count_brokers: Callable[[float], int],
    bootstrap: str,
    timeout_s: float,
    not_yet: tuple[type[Exception], ...],
) -> int:
    """Ask `count_brokers` (given the seconds it may take) until it counts a broker: 0; or until
    `timeout_s`, retrying the `not_yet` errors: 1, with the last reason on stderr."""
    deadline = time.monotonic() + timeout_s
    last_error = "no attempt"
    while time.monotonic() < deadline:
        try:
            if count_brokers(min(2.0, max(deadline - time.monotonic(), 0.1))) > 0:
                return 0
            last_error = "metadata lists no broker yet"
        except not_yet as exc:
            last_error = str(exc) or type(exc).__name__
        time.sleep(RETRY_INTERVAL_S)
    print(f"kafka not ready at {bootstrap} after {timeout_s:g} s: {last_error}", file=sys.stderr)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--bootstrap", default="127.0.0.1:9092", help="host:port (default: %(default)s)"
    )
    parser.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait (default: %(default)s)"
    )
    args = parser.parse_args()
    host, _, port = args.bootstrap.rpartition(":")
    if not port.isdigit():
        parser.error(f"--bootstrap must be host:port, got {args.bootstrap!r}")
    return wait_for_brokers(
        lambda timeout_s: broker_count(host, int(port), timeout_s),
        args.bootstrap,
        args.timeout,
        (OSError, struct.error),
    )


if __name__ == "__main__":
    sys.exit(main())
