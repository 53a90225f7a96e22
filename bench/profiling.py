"""Where the service spends its time under the backlog: py-spy's raw (collapsed-stack) output
summarised as the top functions and source lines by own time, the top functions by inclusive
time, and the share per thread.

Only samples inside the service's two loops count (FOCUS): start-up (imports, model loading,
warm-up) and the metrics server's idle loop are left out. py-spy skips threads it sees
sleeping, so the shares are of busy time, though a thread caught just entering or leaving a
wait (`Condition.wait`) still shows.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

#: Samples per second: often enough for a 10-second run to give thousands of samples, rarely
#: enough that sampling (which pauses the process) costs it little.
PY_SPY_RATE_HZ = 200
TOP_ENTRIES = 15
#: The consuming thread's and the scoring thread's loops (stream/service.py, stream/scoring.py).
FOCUS: tuple[str, ...] = ("ScoringService.run", "ScoringThread.run")
#: "function (path/file.py:123)" → "function (path/file.py)": lines of one function add up.
_LINE_NUMBER = re.compile(r":\d+\)$")


class ProfileEntry(NamedTuple):
    """One function's share of the busy samples."""

    function: str
    percent: float


class Profile(NamedTuple):
    """The summary of one profiled run."""

    #: Samples inside FOCUS, and all samples.
    samples: int
    all_samples: int
    by_thread: list[ProfileEntry]
    own: list[ProfileEntry]
    own_lines: list[ProfileEntry]
    inclusive: list[ProfileEntry]


def py_spy() -> str | None:
    """The py-spy executable (from the bench extra), or None when it is not installed."""
    beside_python = Path(sys.executable).with_name("py-spy")
    return str(beside_python) if beside_python.is_file() else shutil.which("py-spy")


def py_spy_prefix(executable: str, output: Path, *, gil: bool = False) -> list[str]:
    """The command words that run a command under py-spy, recording raw stacks to `output`;
    with `gil`, only the thread holding the GIL is sampled: its Python CPU, where a process
    whose loops mostly wait (an event loop in `select`) would otherwise show its waits."""
    return [
        executable,
        "record",
        "--format",
        "raw",
        "--threads",
        *(["--gil"] if gil else []),
        "--rate",
        str(PY_SPY_RATE_HZ),
        "--output",
        str(output),
        "--",
    ]


def _function(frame: str) -> str:
    return _LINE_NUMBER.sub(")", frame.strip())


def _name(function: str) -> str:
    return function.partition(" (")[0]


def summarize(raw: str, limit: int = TOP_ENTRIES, focus: tuple[str, ...] = FOCUS) -> Profile:
    """Top entries of py-spy's raw output ("thread;frame;…;frame count" per line, outermost
    frame first), counting only stacks that pass through a function named in `focus`."""
    own: Counter[str] = Counter()
    own_lines: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = every = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        every += count
        thread, *frames = stack.split(";")
        functions = [_function(frame) for frame in frames]
        loop = next((i for i, f in enumerate(functions) if _name(f) in focus), None)
        if loop is None:
            continue
        total += count
        threads[thread.strip()] += count
        own[functions[-1]] += count
        own_lines[frames[-1].strip()] += count
        # From the loop down: the frames above it (thread start-up, main) are in every sample.
        for function in set(functions[loop:]):
            inclusive[function] += count

    def top(counter: Counter[str]) -> list[ProfileEntry]:
        return [
            ProfileEntry(name, round(100.0 * count / total, 1))
            for name, count in counter.most_common(limit)
        ]

    return Profile(total, every, top(threads), top(own), top(own_lines), top(inclusive))


def render(profile: Profile) -> str:
    """The profile as text: threads, then own time, then inclusive time."""
    lines = [
        f"py-spy: {profile.samples} busy samples in the service's loops "
        f"(of {profile.all_samples} in all)"
    ]
    for heading, entries in (
        ("by thread", profile.by_thread),
        ("own time (the function itself)", profile.own),
        ("own time by source line", profile.own_lines),
        ("inclusive time (the function and what it calls)", profile.inclusive),
    ):
        lines.append(f"  {heading}:")
        lines.extend(f"    {entry.percent:5.1f}%  {entry.function}" for entry in entries)
    return "\n".join(lines)
