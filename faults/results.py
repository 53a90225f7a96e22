"""What a scenario run is given (`Settings`) and what it found (`Result`: its checks, the
verifier's report, its figures)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from faults.release import Release
from faults.verifier import Report


@dataclass(frozen=True)
class Settings:
    """What every replica of a run is given, and the load."""

    exactly_once: bool
    rate: float = 5_000.0
    partitions: int = 6
    max_batch_size: int = 256
    max_in_flight_records: int = 800
    max_in_flight_bytes: int = 1_048_576
    seed: int = 11
    #: Scenario 6's replicas read every partition's card state before joining
    #: (FRAUD_STATE_WARM_UP).
    state_warm_up: str = "on"
    #: Scenario 7: the release its worker and replicas start as, before the upgrade.
    release: Release | None = None

    @property
    def mode(self) -> str:
        return "exactly-once" if self.exactly_once else "at-least-once"


class Check(NamedTuple):
    """One property checked by a scenario."""

    name: str
    ok: bool
    detail: str


@dataclass
class Result:
    """What one scenario in one mode found."""

    scenario: str
    mode: str
    checks: list[Check] = field(default_factory=list)
    report: Report | None = None
    figures: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, ok, detail))
        return ok
