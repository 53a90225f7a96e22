"""The latency table of `make bench`: event→decision p50, p99 and max under open-loop load, by
processing guarantee, partition count and rate (issue 26's goals: p99 ≤ 50 ms and max ≤ 250 ms
at 5,000 tx/s on 1, 12 and 24 partitions; p99 ≤ 100 ms at 10,000 tx/s on 12).

Each cell is `runs` runs of `bench.contenders.latency` (fraud-loadgen against a fresh service
on fresh topics), and the runs go round the cells in turn, so a slow spell of the machine falls
on every cell alike rather than on one. A cell reports the median of its runs and their range.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from bench.contenders import Run, latency
from bench.harness import Broker
from stream.metric_definitions import STAGES

DEFAULT_PARTITIONS: tuple[int, ...] = (1, 12, 24)
DEFAULT_RATES: tuple[float, ...] = (5_000.0, 10_000.0)
DEFAULT_GUARANTEES: tuple[str, ...] = ("at-least-once", "exactly-once")
DEFAULT_RUNS = 3
GUARANTEES = ("at-least-once", "exactly-once")
#: The figures a cell reports, each as the median of its runs and their [min, max].
FIGURES = ("p50_ms", "p99_ms", "max_ms")


class Cell(NamedTuple):
    guarantee: str
    partitions: int
    rate: float

    @property
    def slug(self) -> str:
        short = "eos" if self.guarantee == "exactly-once" else "alo"
        return f"{short}-{self.partitions}p-{self.rate:g}"


def cells_of(
    guarantees: Iterable[str], partitions: Iterable[int], rates: Iterable[float]
) -> list[Cell]:
    """Every combination, in table order."""
    for guarantee in guarantees:
        if guarantee not in GUARANTEES:
            raise ValueError(f"unknown guarantee {guarantee!r}: one of {', '.join(GUARANTEES)}")
    return [Cell(g, p, r) for g in guarantees for p in partitions for r in rates]


def measure_table(
    run: Run,
    broker: Broker,
    cells: Sequence[Cell],
    runs: int,
    note: Callable[[str], None],
) -> list[dict[str, Any]]:
    """One result per run and cell (a failed run records its error), runs in turns."""
    results: list[dict[str, Any]] = []
    for turn in range(runs):
        for cell in cells:
            note(
                f"latency table, run {turn + 1}/{runs}: {cell.guarantee}, {cell.partitions} "
                f"partitions, {cell.rate:,.0f} tx/s for {run.latency_duration_s:g} s"
            )
            report = run.logs.parent / f"latency-table-{cell.slug}-{turn}"
            try:
                measured = latency(
                    run._replace(partitions=cell.partitions),
                    broker,
                    report,
                    exactly_once=cell.guarantee == "exactly-once",
                    role=f"table-{cell.slug}-{turn}",
                    rate=cell.rate,
                )
            except RuntimeError as exc:
                note(f"latency table: {cell.slug} run {turn + 1} failed: {exc}")
                measured = {"error": str(exc)}
            results.append({**cell._asdict(), "turn": turn, **measured})
    return results


def summarize(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell, in the order first seen: runs, failed runs, lost and duplicate decisions
    summed, each of FIGURES as {median, range}, and each stage's mean time per batch (ms,
    the median over the runs that report it)."""
    by_cell: dict[Cell, list[dict[str, Any]]] = {}
    for result in results:
        cell = Cell(result["guarantee"], result["partitions"], result["rate"])
        by_cell.setdefault(cell, []).append(result)
    rows = []
    for cell, measured in by_cell.items():
        ok = [m for m in measured if "error" not in m]
        row: dict[str, Any] = {
            **cell._asdict(),
            "runs": len(ok),
            "failed": len(measured) - len(ok),
            "lost": sum(m.get("lost") or 0 for m in ok),
            "duplicates": sum(m.get("duplicates") or 0 for m in ok),
        }
        for figure in FIGURES:
            values = [m[figure] for m in ok if m.get(figure) is not None]
            row[figure] = (
                {"median": statistics.median(values), "range": [min(values), max(values)]}
                if values
                else None
            )
        stages: dict[str, float] = {}
        for stage in STAGES:
            means = [m["stage_mean_ms"][stage] for m in ok if stage in m.get("stage_mean_ms", {})]
            if means:
                stages[stage] = statistics.median(means)
        row["stage_mean_ms"] = stages
        rows.append(row)
    return rows


def render_stages(rows: Sequence[dict[str, Any]]) -> str:
    """Where a batch's time goes, per cell: each stage's mean ms per batch (median of runs)."""
    lines = [
        "| guarantee | partitions | tx/s | " + " | ".join(STAGES) + " |",
        "| --- | ---: | ---: | " + " | ".join("---:" for _ in STAGES) + " |",
    ]
    for row in rows:
        stages = row.get("stage_mean_ms") or {}
        cells = [f"{stages[s]:.1f}" if s in stages else "-" for s in STAGES]
        lines.append(
            f"| {row['guarantee']} | {row['partitions']} | {row['rate']:,.0f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def render(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as a Markdown table: median (min-max) per figure."""
    lines = [
        "| guarantee | partitions | tx/s | runs | p50 ms | p99 ms | max ms | lost | duplicates |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        shown = [_shown(row[figure]) for figure in FIGURES]
        runs = f"{row['runs']}" + (f" ({row['failed']} failed)" if row["failed"] else "")
        lines.append(
            f"| {row['guarantee']} | {row['partitions']} | {row['rate']:,.0f} | {runs} | "
            + " | ".join(shown)
            + f" | {row['lost']} | {row['duplicates']} |"
        )
    return "\n".join(lines)


def _shown(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "-"
    low, high = figure["range"]
    return f"{figure['median']:.0f} ({low:.0f}-{high:.0f})"
