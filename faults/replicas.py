"""The service replicas of a scenario, as child processes, and what is sampled from them.

Each replica is `python -m stream run` (or the features worker, `python -m terminals run`) with
its own instance id, metrics port and log file, so signals (SIGKILL, SIGSTOP/SIGCONT, SIGTERM)
are real. It runs this tree's code, or a release's (`faults/release.py`): that release's
interpreter, from its source directory. The `Sampler` scrapes every live replica
a few times a second: in-flight records and bytes (the memory bound), paused partitions and
readiness.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path

from plumbing.metrics_text import by_key, samples, scrape

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
SCRAPE_TIMEOUT_S = 2.0
SAMPLE_EVERY_S = 0.2
STOP_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def lag_samples(exposition: str) -> list[tuple[dict[str, str], float]]:
    """The consumer lag per partition a replica exposes: (labels, value) each."""
    return [
        (s.labels, s.value) for s in samples(exposition) if s.name == "fraud_consumer_lag_records"
    ]


@dataclass
class Replica:
    """One `fraud-scorer run` (or `fraud-features run`) child process."""

    name: str
    args: list[str]
    log_path: Path
    metrics_port: int = field(default_factory=free_port)
    #: `stream` (the scorer) or `terminals` (the features worker).
    module: str = "stream"
    #: The interpreter and working directory: this tree's, or a release's.
    python: str = sys.executable
    cwd: Path = REPO
    process: subprocess.Popen[bytes] | None = None
    #: Set when the scenario ends this process on purpose (or another took its place), so
    #: that its exit is no failure.
    retired: bool = False

    def start(self) -> Replica:
        command = [self.python, "-m", self.module, "run", *self.args]
        command += ["--instance-id", self.name, "--metrics-host", "127.0.0.1"]
        command += ["--metrics-port", str(self.metrics_port)]
        with self.log_path.open("ab") as out:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                command, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def again(self) -> Replica:
        """The same replica (name, code, arguments, log) as a new process, not started."""
        return dataclasses.replace(self, metrics_port=free_port(), process=None, retired=False)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def kill(self) -> None:
        """kill -9, and reap it."""
        self.retired = True
        self.signal(signal.SIGKILL)
        self.wait(STOP_TIMEOUT_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (drain, commit, close); return the exit status."""
        self.retired = True
        self.signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def exposition(self) -> str:
        """Its /metrics, as served."""
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics", SCRAPE_TIMEOUT_S)

    def metrics(self) -> dict[str, float]:
        """Its samples' values by `name{labels}`."""
        return by_key(self.exposition())

    def ready(self) -> bool:
        """Whether /readyz answers 200 (503: not ready)."""
        return self.readiness()[0]

    def readiness(self) -> tuple[bool, str]:
        """/readyz: 200 or 503, and the replica's reason."""
        return self._probe("/readyz")

    def healthy(self) -> bool:
        """Whether /healthz answers 200 (503: the stream loop is stuck; a liveness probe would
        restart the replica)."""
        return self._probe("/healthz")[0]

    def _probe(self, path: str) -> tuple[bool, str]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                return int(response.status) == 200, response.read().decode().strip()
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                return False, exc.read().decode().strip()
            raise

    def lags(self) -> dict[int, float]:
        """Consumer lag per input partition, for the partitions this replica owns (as its
        last statistics report said)."""
        return {int(labels["partition"]): value for labels, value in lag_samples(self.exposition())}

    def log_tail(self, chars: int = 4_000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def rss_mb(self) -> float:
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0


@dataclass
class Peaks:
    """The highest in-flight figures seen, and readiness over time."""

    in_flight_records: float = 0.0
    in_flight_bytes: float = 0.0
    rss_mb: float = 0.0
    samples: int = 0
    #: (epoch ms, replica, ready, reason) each time a replica's readiness changed.
    readiness: list[tuple[int, str, bool, str]] = field(default_factory=list)


class Sampler(threading.Thread):
    """Scrapes the live replicas every `SAMPLE_EVERY_S` until stopped."""

    def __init__(self, replicas: Iterable[Replica]) -> None:
        super().__init__(name="sampler", daemon=True)
        self._replicas = replicas
        self.peaks = Peaks()
        self._last_ready: dict[str, bool] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(SAMPLE_EVERY_S):
            for replica in list(self._replicas):
                if replica.alive:
                    self._sample(replica)

    def _sample(self, replica: Replica) -> None:
        peaks = self.peaks
        try:
            metrics = replica.metrics()
            ready, reason = replica.readiness()
            rss = replica.rss_mb()
        except (OSError, HTTPException, ValueError):
            return  # starting, stopping, or frozen: nothing to read
        peaks.samples += 1
        peaks.in_flight_records = max(peaks.in_flight_records, metrics["fraud_in_flight_records"])
        peaks.in_flight_bytes = max(peaks.in_flight_bytes, metrics["fraud_in_flight_bytes"])
        peaks.rss_mb = max(peaks.rss_mb, rss)
        if self._last_ready.get(replica.name) != ready:
            self._last_ready[replica.name] = ready
            peaks.readiness.append((time.time_ns() // 1_000_000, replica.name, ready, reason))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
