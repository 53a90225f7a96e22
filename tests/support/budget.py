"""The budget of one input from outside: the most it may allocate and the longest it may take.

Every input surface has a property test (docs/threat-model.md) that drives its real decoding
path with hostile inputs inside `within(budget)`: the input must be refused or used, never
crash the caller, and stay under the budget. Memory is Python's peak allocation as tracemalloc
sees it (numpy's arrays included); the time bound is generous (tens of times the usual cost),
so it catches an input that loops or allocates without bound, not a slow machine.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Budget:
    """What one input may cost: `peak_bytes` allocated at most, `seconds` at most."""

    peak_bytes: int
    seconds: float

    def __post_init__(self) -> None:
        if self.peak_bytes <= 0 or self.seconds <= 0:
            raise ValueError(f"a budget must be positive, got {self}")


@dataclass
class Spent:
    """What the block inside `within` cost (filled when it ends)."""

    peak_bytes: int = 0
    seconds: float = 0.0


@contextmanager
def within(budget: Budget, what: str = "the input") -> Iterator[Spent]:
    """Run the block with tracemalloc on, and fail the test when it allocated or took more
    than `budget`, whether it returned or raised. An exception from the block within budget
    passes through: the caller tells a refusal from a crash."""
    spent = Spent()
    started_tracing = not tracemalloc.is_tracing()
    if started_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    started = time.perf_counter()
    try:
        yield spent
    finally:
        spent.seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        spent.peak_bytes = max(0, peak - base)
        if started_tracing:
            tracemalloc.stop()
        # In `finally`: an input over budget fails the test even when it was refused.
        assert spent.peak_bytes <= budget.peak_bytes, (
            f"{what} allocated {spent.peak_bytes:,} bytes at its peak, over its budget of "
            f"{budget.peak_bytes:,}"
        )
        assert spent.seconds <= budget.seconds, (
            f"{what} took {spent.seconds:.3f}s, over its budget of {budget.seconds}s"
        )
