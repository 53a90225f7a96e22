"""The suite's own single-node Kafka broker, which it may kill -9 and restart.

It is `ops/kafka/kafka.sh` run on other ports with its own state folder, so it never touches the
development broker (127.0.0.1:9092) or anyone else's.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
KAFKA_SH = REPO / "ops" / "kafka" / "kafka.sh"
DEFAULT_PORT = 9292
DEFAULT_STATE_DIR = REPO / ".kafka-faults"
#: A start includes resolving the jars the first time (Maven) and a JVM on a busy machine.
START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0


class Broker:
    """Start, kill -9, restart and stop the suite's broker (ports `port` and `port + 1`)."""

    def __init__(self, port: int = DEFAULT_PORT, state_dir: Path = DEFAULT_STATE_DIR) -> None:
        self.port = port
        self.state_dir = state_dir
        self.bootstrap = f"127.0.0.1:{port}"
        self._env = {
            **os.environ,
            "KAFKA_PORT": str(port),
            "KAFKA_CONTROLLER_PORT": str(port + 1),
            "KAFKA_STATE_DIR": str(state_dir),
        }

    def _kafka_sh(self, command: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KAFKA_SH), command],
            env=self._env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    @property
    def running(self) -> bool:
        return self._kafka_sh("status", STOP_TIMEOUT_S).returncode == 0

    def up(self) -> None:
        """Start the broker (or find it running) and wait until it serves metadata."""
        result = self._kafka_sh("up", START_TIMEOUT_S)
        if result.returncode != 0:
            raise RuntimeError(f"the fault broker did not start:\n{result.stdout}{result.stderr}")
        log.info("%s", result.stdout.strip().splitlines()[-1])

    def kill(self) -> int:
        """kill -9 the broker and wait until it is gone; return its pid."""
        pid = int((self.state_dir / "kafka.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return pid

    def down(self) -> None:
        result = self._kafka_sh("down", STOP_TIMEOUT_S)
        if result.returncode != 0:
            log.error("stopping the fault broker failed: %s", result.stderr.strip())


def _alive(pid: int) -> bool:
    """Whether `pid` runs (kafka.sh started the broker in the background, so whoever adopted
    it reaps it; a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
