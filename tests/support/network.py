"""Local ports and HTTP probes of the processes a test starts."""

from __future__ import annotations

import random
import socket
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now.

    Drawn below the kernel's ephemeral range: a port in it can be taken, between this check
    and the server's bind, by any outgoing connection (a Kafka client's, say), which is how
    a test's second scorer process once found its metrics port in use.
    """
    low, _ = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, low)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port below {low} on 127.0.0.1")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def http_status(port: int, path: str) -> int:
    """The status of GET http://127.0.0.1:`port``path`; 0 while nothing listens there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except urllib.error.URLError:
        return 0
