"""Traffic shapes of a load run and the open-loop schedule they give.

A shape is a rate curve over the run: transactions per second as a function of the seconds
since the start. The `Schedule` integrates it once, so record i (counting from 0) is due at the
moment the cumulative rate reaches i; the sender keeps to that whatever the service does.

- ``constant``: `rate` throughout.
- ``ramp``: linear from 0 at the start to `rate` at the end.
- ``diurnal``: one day compressed into the run (the run starts at midnight); the quietest
  moment is 03:00 at `rate` * DIURNAL_TROUGH_RATIO, the busiest is lunch (12:30) at `rate`,
  joined by half cosines. With the default peak of 5,000 tx/s: 50 tx/s at 3 AM.
- ``burst``: `rate` between bursts; every `burst_every_s` seconds, a burst of `burst_length_s`
  seconds at `rate` * `burst_factor` (each burst closes its period, so a run starts quiet).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

Seconds = npt.NDArray[np.float64]

SHAPES: tuple[str, ...] = ("constant", "ramp", "diurnal", "burst")
#: The default --rate of each shape (the peak for diurnal: its seed figure, 5,000 tx/s at lunch).
DEFAULT_RATES: dict[str, float] = {
    "constant": 2_000.0,
    "ramp": 2_000.0,
    "diurnal": 5_000.0,
    "burst": 2_000.0,
}

HOURS_PER_DAY = 24.0
DIURNAL_TROUGH_HOUR = 3.0
DIURNAL_PEAK_HOUR = 12.5
#: 50 tx/s at 3 AM against 5,000 tx/s at lunch.
DIURNAL_TROUGH_RATIO = 50.0 / 5_000.0

DEFAULT_BURST_EVERY_S = 10.0
DEFAULT_BURST_LENGTH_S = 1.0
DEFAULT_BURST_FACTOR = 5.0

#: Resolution of the integrated schedule: fine enough that a burst edge is off by well under
#: one record at any rate this tool can send…
SCHEDULE_STEP_S = 0.001
#: …but never more points than this (8 MB), so a day-long run does not eat memory.
MAX_SCHEDULE_STEPS = 1_000_000


class Shape(Protocol):
    """A rate curve: transactions per second at given seconds since the start of the run."""

    @property
    def name(self) -> str: ...

    def rate_at(self, t_s: Seconds) -> Seconds:
        """Transactions per second at each of `t_s` (vectorised)."""
        ...


@dataclass(frozen=True)
class Constant:
    """The same rate throughout."""

    rate: float
    name: str = "constant"

    def rate_at(self, t_s: Seconds) -> Seconds:
        return np.full(np.shape(t_s), self.rate)


@dataclass(frozen=True)
class Ramp:
    """Linear from 0 at the start to `rate` at `duration_s`."""

    rate: float
    duration_s: float
    name: str = "ramp"

    def rate_at(self, t_s: Seconds) -> Seconds:
        return self.rate * np.clip(t_s / self.duration_s, 0.0, 1.0)


@dataclass(frozen=True)
class Diurnal:
    """A day compressed into `duration_s`: trough at 03:00, `peak_rate` at lunch (12:30)."""

    peak_rate: float
    duration_s: float
    name: str = "diurnal"

    def hour_of_day(self, t_s: Seconds) -> Seconds:
        """The compressed clock: 00:00 at the start, 24:00 at the end."""
        return np.asarray(t_s, np.float64) / self.duration_s * HOURS_PER_DAY

    def rate_at(self, t_s: Seconds) -> Seconds:
        rise_h = DIURNAL_PEAK_HOUR - DIURNAL_TROUGH_HOUR
        since_trough = (self.hour_of_day(t_s) - DIURNAL_TROUGH_HOUR) % HOURS_PER_DAY
        # 0 at the trough, 1 at the peak: rising until lunch, falling until 3 AM next day.
        progress = np.where(
            since_trough <= rise_h,
            since_trough / rise_h,
            1.0 - (since_trough - rise_h) / (HOURS_PER_DAY - rise_h),
        )
        weight = (1.0 - np.cos(np.pi * progress)) / 2.0
        trough = self.peak_rate * DIURNAL_TROUGH_RATIO
        return trough + (self.peak_rate - trough) * weight


@dataclass(frozen=True)
class Burst:
    """`rate`, with a burst of `length_s` at `rate` * `factor` closing every `every_s`."""

    rate: float
    every_s: float = DEFAULT_BURST_EVERY_S
    length_s: float = DEFAULT_BURST_LENGTH_S
    factor: float = DEFAULT_BURST_FACTOR
    name: str = "burst"

    def __post_init__(self) -> None:
        if not 0 < self.length_s <= self.every_s:
            raise ValueError(
                f"burst length must be in (0, burst period {self.every_s}] s, got {self.length_s}"
            )
        if not self.factor > 0:
            raise ValueError(f"burst factor must be > 0, got {self.factor}")

    def rate_at(self, t_s: Seconds) -> Seconds:
        in_burst = np.mod(t_s, self.every_s) >= self.every_s - self.length_s
        return np.where(in_burst, self.rate * self.factor, self.rate)


def make_shape(
    name: str,
    rate: float,
    duration_s: float,
    *,
    burst_every_s: float = DEFAULT_BURST_EVERY_S,
    burst_length_s: float = DEFAULT_BURST_LENGTH_S,
    burst_factor: float = DEFAULT_BURST_FACTOR,
) -> Shape:
    """The shape called `name` (one of SHAPES) for a run of `duration_s` at `rate`.

    Raises:
        ValueError: unknown name, or a parameter out of range.
    """
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive finite number, got {rate}")
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration must be a positive finite number, got {duration_s}")
    if name == "constant":
        return Constant(rate)
    if name == "ramp":
        return Ramp(rate, duration_s)
    if name == "diurnal":
        return Diurnal(rate, duration_s)
    if name == "burst":
        return Burst(rate, burst_every_s, burst_length_s, burst_factor)
    raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {name!r}")


class Schedule:
    """When each record of an open-loop run is due, from a shape integrated over the run."""

    def __init__(self, shape: Shape, duration_s: float) -> None:
        steps = max(1, min(MAX_SCHEDULE_STEPS, math.ceil(duration_s / SCHEDULE_STEP_S)))
        self.shape = shape
        self.duration_s = duration_s
        self._t_s = np.linspace(0.0, duration_s, steps + 1)
        rate = shape.rate_at(self._t_s)
        # Trapezoids: exact for constant and linear rates, within a fraction of a record at
        # the edges of a burst.
        increments = (rate[1:] + rate[:-1]) * 0.5 * np.diff(self._t_s)
        self._cumulative = np.concatenate(([0.0], np.cumsum(increments)))
        #: Records in the whole run.
        self.total = round(float(self._cumulative[-1]))

    @property
    def mean_rate(self) -> float:
        """Records per second over the whole run."""
        return self.total / self.duration_s

    def due_by(self, elapsed_s: float) -> int:
        """How many records are due `elapsed_s` seconds after the start (record 0 at once)."""
        if elapsed_s < 0:
            return 0
        reached = float(np.interp(elapsed_s, self._t_s, self._cumulative))
        return min(self.total, math.floor(reached) + 1)

    def due_at(self, index: int) -> float:
        """Seconds after the start at which record `index` (from 0) is due."""
        return float(np.interp(index, self._cumulative, self._t_s))

    def rate_at(self, elapsed_s: float) -> float:
        """The shape's rate at `elapsed_s`, records per second."""
        return float(self.shape.rate_at(np.array([elapsed_s]))[0])

    def per_second(self) -> list[float]:
        """Records due in each whole second of the run: [0, 1), [1, 2), …"""
        edges = np.arange(0.0, math.ceil(self.duration_s) + 1.0)
        reached = np.interp(np.minimum(edges, self.duration_s), self._t_s, self._cumulative)
        return [float(x) for x in np.diff(reached)]
