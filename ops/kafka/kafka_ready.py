"""Exit 0 once a Kafka broker answers a Metadata request; standard library only.

`make kafka-up` runs this with the system Python before any virtualenv exists, so it speaks the
wire protocol itself: one Metadata v4 request (the oldest version Kafka 4.x still serves), and
the broker is ready when the response lists at least one broker.

With `--config FILE` (librdkafka properties, one `key=value` a line, `#` comments: the same file
a client uses) it first does what the client's settings say: TLS verified against
`ssl.ca.location` (`security.protocol=SSL` or `SASL_SSL`), then SASL (`sasl.mechanisms`
SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN, with `sasl.username` and `sasl.password`). So "ready"
on a secured broker means that the certificate verifies, the user authenticates and the metadata
lists the broker. A rejected certificate or password is retried like any other "not yet" (a
broker's SCRAM users come from its metadata log, not from its configuration, so a refusal need
not be final while it starts); the line printed at the timeout gives the last reason.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import secrets
import socket
import ssl
import struct
import sys
import time
from pathlib import Path

METADATA_API_KEY = 3
METADATA_VERSION = 4
SASL_HANDSHAKE_API_KEY = 17
SASL_HANDSHAKE_VERSION = 1
SASL_AUTHENTICATE_API_KEY = 36
SASL_AUTHENTICATE_VERSION = 1
CORRELATION_ID = 0x5EED
CLIENT_ID = b"kafka-ready"
RETRY_INTERVAL_S = 0.5
SCRAM_HASHES = {"SCRAM-SHA-512": "sha512", "SCRAM-SHA-256": "sha256"}
SASL_PROTOCOLS = ("SASL_SSL", "SASL_PLAINTEXT")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")


class AuthenticationError(Exception):
    """The broker answered and said no: to the certificate or to the credentials."""


def read_properties(path: Path) -> dict[str, str]:
    """librdkafka settings from a properties file: `key=value` lines, `#` comments, blank lines."""
    settings: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{path}:{number}: expected key=value, got {line!r}")
        settings[key.strip()] = value.strip()
    return settings


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


def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _sasl_authenticate(sock: socket.socket, auth_bytes: bytes) -> bytes:
    response = _call(
        sock,
        SASL_AUTHENTICATE_API_KEY,
        SASL_AUTHENTICATE_VERSION,
        struct.pack(">i", len(auth_bytes)) + auth_bytes,
    )
    error_code, message_size = struct.unpack(">hh", response[:4])
    offset = 4 + max(message_size, 0)
    message = response[4:offset].decode(errors="replace") if message_size >= 0 else ""
    if error_code != 0:
        raise AuthenticationError(f"authentication failed (error {error_code}): {message}")
    (size,) = struct.unpack(">i", response[offset : offset + 4])
    return response[offset + 4 : offset + 4 + max(size, 0)]


def _scram(sock: socket.socket, mechanism: str, username: str, password: str) -> None:
    """RFC 5802 client exchange (no channel binding), the way Kafka's SCRAM login module does it."""
    digest = SCRAM_HASHES[mechanism]
    name = username.replace("=", "=3D").replace(",", "=2C")
    nonce = secrets.token_urlsafe(24)
    client_first_bare = f"n={name},r={nonce}"
    server_first = _sasl_authenticate(sock, f"n,,{client_first_bare}".encode()).decode()
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    if not fields.get("r", "").startswith(nonce):
        raise AuthenticationError("SCRAM: the broker's nonce does not extend ours")
    salted = hashlib.pbkdf2_hmac(
        digest, password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", digest)
    final_without_proof = f"c=biws,r={fields['r']}"
    auth_message = f"{client_first_bare},{server_first},{final_without_proof}".encode()
    signature = hmac.digest(hashlib.new(digest, client_key).digest(), auth_message, digest)
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    server_final = _sasl_authenticate(sock, f"{final_without_proof},p={proof.decode()}".encode())
    server_key = hmac.digest(salted, b"Server Key", digest)
    expected = base64.b64encode(hmac.digest(server_key, auth_message, digest)).decode()
    if server_final.decode() != f"v={expected}":
        raise AuthenticationError("SCRAM: the broker's signature does not verify")


def _authenticate(sock: socket.socket, settings: dict[str, str]) -> None:
    mechanism = settings.get("sasl.mechanisms", settings.get("sasl.mechanism", "GSSAPI"))
    if mechanism not in (*SCRAM_HASHES, "PLAIN"):
        raise ValueError(f"sasl.mechanisms={mechanism} is not supported here")
    response = _call(sock, SASL_HANDSHAKE_API_KEY, SASL_HANDSHAKE_VERSION, _string(mechanism))
    (error_code,) = struct.unpack(">h", response[:2])
    if error_code != 0:
        raise AuthenticationError(f"the broker does not enable SASL mechanism {mechanism}")
    username, password = settings.get("sasl.username", ""), settings.get("sasl.password", "")
    if mechanism == "PLAIN":
        _sasl_authenticate(sock, f"\0{username}\0{password}".encode())
    else:
        _scram(sock, mechanism, username, password)


def _connect(host: str, port: int, timeout_s: float, settings: dict[str, str]) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout_s)
    protocol = settings.get("security.protocol", "PLAINTEXT").upper()
    try:
        if protocol in TLS_PROTOCOLS:
            context = ssl.create_default_context(cafile=settings.get("ssl.ca.location"))
            if settings.get("ssl.endpoint.identification.algorithm", "https") == "none":
                context.check_hostname = False
            try:
                sock = context.wrap_socket(sock, server_hostname=host)
            except ssl.SSLCertVerificationError as exc:
                raise AuthenticationError(f"TLS: {exc.verify_message}") from exc
        if protocol in SASL_PROTOCOLS:
            _authenticate(sock, settings)
    except BaseException:
        sock.close()
        raise
    return sock


def broker_count(
    host: str, port: int, timeout_s: float, settings: dict[str, str] | None = None
) -> int:
    """Connect as `settings` say, send one Metadata request and return how many brokers it lists."""
    with _connect(host, port, timeout_s, settings or {}) as sock:
        # topics = null (all topics), allow_auto_topic_creation = false
        response = _call(sock, METADATA_API_KEY, METADATA_VERSION, struct.pack(">ib", -1, 0))
    _throttle_ms, brokers = struct.unpack(">ii", response[:8])
    return int(brokers)


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
    parser.add_argument(
        "--config", type=Path, help="librdkafka properties file with the security settings"
    )
    args = parser.parse_args()
    try:
        settings = read_properties(args.config) if args.config else {}
    except (OSError, ValueError) as exc:
        print(f"kafka_ready: cannot read --config: {exc}", file=sys.stderr)
        return 2
    host, _, port = args.bootstrap.rpartition(":")
    deadline = time.monotonic() + args.timeout
    last_error = "no attempt"
    while time.monotonic() < deadline:
        try:
            if broker_count(host, int(port), 2.0, settings) > 0:
                return 0
            last_error = "metadata lists no broker yet"
        except ValueError as exc:
            print(f"kafka_ready: {exc}", file=sys.stderr)
            return 2
        except (OSError, ConnectionError, struct.error, AuthenticationError) as exc:
            last_error = str(exc) or type(exc).__name__
        time.sleep(RETRY_INTERVAL_S)
    print(
        f"kafka not ready at {args.bootstrap} after {args.timeout:.0f}s: {last_error}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
