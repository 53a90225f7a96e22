"""The short fault-injection suite (`python -m faults --short`) against a broker of its own on
127.0.0.1:9292 that this module starts and stops (`make test` runs it; CI has no broker
running). Each of its scenarios runs once, in the mode where it tells the most, so that CI stays
short: a replica killed and the dead-letter topic deleted at least once; a zombie (fencing), a
rebalance storm and a rolling upgrade from release 0.1.0 with state (`make upgrade-check`)
exactly once. Each scenario's figures are printed; `make faults` runs every scenario in both
modes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from faults.broker import Broker

REPO = Path(__file__).resolve().parents[2]
#: One mode of the short suite takes about 2 minutes on a busy 2-core machine (exactly-once with
#: the upgrade about 3, a first install of the release included).
MODE_TIMEOUT_S = 600
#: The short suite's scenarios (1 kill -9 a replica, 3 zombie, 4 rebalance storm, 5 dead-letter
#: topic deleted) and the rolling upgrade from release 0.1.0 (7), each in one mode.
SCENARIOS = {"at-least-once": ("1", "5"), "exactly-once": ("3", "4", "7")}


@pytest.mark.timeout(MODE_TIMEOUT_S + 60)
@pytest.mark.parametrize("mode", list(SCENARIOS))
def test_the_short_fault_suite_passes(
    broker: Broker, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    command = [
        sys.executable,
        "-m",
        "faults",
        "--short",
        "--mode",
        mode,
        "--port",
        str(broker.port),
        "--scenario",
        *SCENARIOS[mode],
    ]
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=MODE_TIMEOUT_S, check=False
    )
    with capsys.disabled():
        print(f"\n{result.stdout}")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-6000:]}"
