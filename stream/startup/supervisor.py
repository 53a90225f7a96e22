"""`fraud-scorer run --processes N`: N consumer processes of one replica's group on one host.

One CPython process decides at most what one core does (its two threads share a GIL), so a
host with more cores runs more processes in the consumer group; Kafka spreads the partitions
over them like over replicas on other hosts.

The supervisor's responsibilities:
- start N children, each `fraud-scorer run` with the same settings, `--processes 1`, its own
  instance id (`<instance_id>-<i>`, so dead letters, logs and transactional ids tell them
  apart) and its own metrics port (`metrics_port + i`; 0 stays 0);
- pass SIGTERM and SIGINT on to every child and wait for their drain;
- restart a child that dies (a crash, a fatal Kafka error) after a pause, unless it stopped on
  bad configuration (exit 2), which a restart would only repeat;
- kill (and so restart) a child whose `/healthz` keeps failing (`stream/startup/child_health.py`): a
  pod's liveness probe sees only the first process;
- exit with the worst exit status of the children once all have stopped;
- on Linux, make each child receive SIGTERM (and drain) should the supervisor itself die
  without passing a signal on (SIGKILL, OOM killer), instead of consuming on, orphaned.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType

from stream.startup import child_health
from stream.startup.config import ScorerSettings

log = logging.getLogger(__name__)

#: A crashed child is started again after this pause (a crash loop costs little).
RESTART_PAUSE_S = 2.0
#: How often the supervisor looks at its children.
WATCH_INTERVAL_S = 0.2
EXIT_USAGE = 2


def child_command(argv: Sequence[str], config: ScorerSettings, index: int) -> list[str]:
    """The command line of child `index`: the supervisor's own arguments, then the overrides
    (argparse keeps the last value of a repeated flag)."""
    return [
        sys.executable,
        "-m",
        "stream",
        *argv,
        "--processes",
        "1",
        "--instance-id",
        f"{config.instance_id}-{index}",
        "--metrics-port",
        str(metrics_port_of(config, index)),
    ]


def metrics_port_of(config: ScorerSettings, index: int) -> int:
    """Child `index`'s metrics (and health) port; 0 stays 0 (none)."""
    return config.metrics_port + index if config.metrics_port else 0


#: prctl(2) option: the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def _die_with_supervisor(supervisor_pid: int) -> None:
    """In a child, before it runs: SIGTERM when the supervisor dies (Linux only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor_pid:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    if not sys.platform.startswith("linux"):
        return subprocess.Popen(command)
    supervisor_pid = os.getpid()
    return subprocess.Popen(command, preexec_fn=lambda: _die_with_supervisor(supervisor_pid))


def supervise(
    argv: Sequence[str], config: ScorerSettings, stop_requested: Callable[[], bool] = lambda: False
) -> int:
    """Run `config.processes` children until they all stop; return the worst exit status.
    `stop_requested`: whether a stop came before this function took the signals over."""
    commands = [child_command(argv, config, i) for i in range(config.processes)]
    children = [_start(command) for command in commands]
    stopping = False
    codes: dict[int, int] = {}

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        log.info("received %s: stopping %s processes", signal.Signals(signum).name, len(children))
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    if stop_requested():
        forward(signal.SIGTERM, None)
    log.info("started %s processes, metrics ports from %s", len(children), config.metrics_port)
    health = _child_health(config)
    if health is not None:
        for index in range(len(children)):
            health.started(index, time.monotonic())
    restart_at: dict[int, float] = {}
    while len(codes) < len(children):
        time.sleep(WATCH_INTERVAL_S)
        now = time.monotonic()
        for index, child in enumerate(children):
            code = child.poll()
            if code is None or index in codes:
                continue
            if health is not None:
                health.gone(index)
            if stopping or code == EXIT_USAGE:
                codes[index] = code
            elif index not in restart_at:
                log.error("process %s exited with status %s: restarting it", index, code)
                restart_at[index] = now + RESTART_PAUSE_S
            elif now >= restart_at[index]:
                del restart_at[index]
                children[index] = _start(commands[index])
                if health is not None:
                    health.started(index, time.monotonic())
        if health is not None and not stopping:
            for index, why in health.due(now):
                log.error("process %s: %s; killing it, to be restarted", index, why)
                children[index].kill()
    worst = max(codes.values(), key=abs)
    return worst if worst >= 0 else 128 - worst  # killed by signal N: 128 + N, as a shell says


def _child_health(config: ScorerSettings) -> child_health.ChildHealth | None:
    """The watch over the children's /healthz; none without a metrics port (no endpoint).
    Its timings are read from the module now, not when it was imported (a test shortens them)."""
    if not config.metrics_port:
        return None
    host = config.metrics_host
    return child_health.ChildHealth(
        lambda index: child_health.healthz_ok(host, metrics_port_of(config, index)),
        interval_s=child_health.CHECK_INTERVAL_S,
        grace_s=child_health.STARTUP_GRACE_S,
        failures_before_kill=child_health.FAILURES_BEFORE_KILL,
    )
