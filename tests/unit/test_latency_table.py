"""`make bench`'s latency table: its cells from the options, and each cell's median and range
over its runs, failed runs counted apart."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench.contenders import stage_means_of
from bench.latency_table import Cell, cells_of, render, render_stages, summarize
from bench.pipeline_bench import build_parser, table_cells
from stream.metrics import ServiceMetrics


def _cells(*argv: str) -> tuple[list[Cell], int]:
    return table_cells(build_parser().parse_args(list(argv)))


def test_the_default_table_is_every_guarantee_partition_count_and_rate_three_times() -> None:
    cells, runs = _cells()
    assert runs == 3 and len(cells) == 2 * 3 * 2
    assert Cell("exactly-once", 24, 10_000.0) in cells and cells[0] == Cell("at-least-once", 1, 5e3)
    assert _cells("--quick") == ([Cell("at-least-once", 1, 5_000.0)], 1)
    assert _cells("--table-partitions", "12", "--table-rates", "7500", "--table-runs", "0") == (
        [Cell(g, 12, 7_500.0) for g in ("at-least-once", "exactly-once")],
        0,
    )


@pytest.mark.parametrize(
    "argv", [("--table-partitions", "1,x"), ("--table-rates", "0"), ("--table-partitions", "-1")]
)
def test_a_bad_list_is_refused_by_the_parser(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(list(argv))


def test_an_unknown_guarantee_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown guarantee 'exactly-twice'"):
        cells_of(["exactly-twice"], [1], [5_000.0])


def _run(partitions: int, p99: float, **more: object) -> dict[str, object]:
    figures = {"p50_ms": p99 / 4, "p99_ms": p99, "max_ms": p99 * 2, "lost": 0, "duplicates": 0}
    return {"guarantee": "at-least-once", "partitions": partitions, "rate": 5e3, **figures, **more}


def test_a_cell_reports_the_median_and_range_of_its_runs_and_counts_failures_apart() -> None:
    results = [
        _run(1, 30.0),
        _run(12, 200.0, lost=2),
        _run(1, 90.0),
        _run(12, 100.0),
        _run(1, 40.0, duplicates=5),
        {"guarantee": "at-least-once", "partitions": 12, "rate": 5e3, "error": "no summary"},
    ]
    one, twelve = summarize(results)
    assert (one["partitions"], one["runs"], one["failed"]) == (1, 3, 0)
    assert one["p99_ms"] == {"median": 40.0, "range": [30.0, 90.0]}
    assert one["max_ms"] == {"median": 80.0, "range": [60.0, 180.0]}
    assert one["duplicates"] == 5
    assert (twelve["runs"], twelve["failed"], twelve["lost"]) == (2, 1, 2)
    assert twelve["p99_ms"] == {"median": 150.0, "range": [100.0, 200.0]}
    table = render([one, twelve]).splitlines()
    assert table[2] == (
        "| at-least-once | 1 | 5,000 | 3 | 10 (8-22) | 40 (30-90) | 80 (60-180) | 0 | 5 |"
    )
    assert table[3].startswith("| at-least-once | 12 | 5,000 | 2 (1 failed) | ")


def test_a_cell_whose_runs_all_failed_shows_no_figures() -> None:
    (row,) = summarize([{"guarantee": "exactly-once", "partitions": 24, "rate": 1e4, "error": "x"}])
    assert row["runs"] == 0 and row["p99_ms"] is None
    assert "| 0 (1 failed) | - | - | - |" in render([row])


def test_a_cell_reports_where_its_batches_spent_their_time() -> None:
    results = [
        _run(24, 300.0, stage_mean_ms={"queue": 40.0, "delivery": 50.0}),
        _run(24, 900.0, stage_mean_ms={"queue": 190.0, "delivery": 220.0}),
        _run(24, 500.0, stage_mean_ms={"queue": 60.0}),  # a run whose delivery was not read
        _run(1, 60.0),  # a run from before the stages were recorded
    ]
    twenty_four, one = summarize(results)
    assert twenty_four["stage_mean_ms"] == {"queue": 60.0, "delivery": 135.0}
    assert one["stage_mean_ms"] == {}
    table = render_stages([twenty_four, one]).splitlines()
    assert table[0].startswith("| guarantee | partitions | tx/s | queue | batch |")
    assert table[2].startswith("| at-least-once | 24 | 5,000 | 60.0 | - |")
    assert table[2].endswith("| 135.0 |")
    assert table[3].endswith("| - | - |")


def test_stage_means_are_each_stages_sum_over_its_count_in_ms() -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    metrics.observe_stages({"queue": 0.010, "delivery": 0.030})
    metrics.observe_stages({"queue": 0.020})
    means = stage_means_of(generate_latest(metrics.registry).decode())
    assert means == pytest.approx({"queue": 15.0, "delivery": 30.0})
