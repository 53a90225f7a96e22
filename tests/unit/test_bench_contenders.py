"""`make bench`'s contenders: each is labelled, named in the JSON line and in the table, every
ratio compares two of them, and every budget in bench/bounds.json is a figure the bench makes."""

from __future__ import annotations

import json

from bench.contenders import CONTENDERS, LABELS
from bench.harness import Measurement
from bench.pipeline_bench import DEFAULT_BOUNDS
from bench.summary import LATENCY_FIGURES, RATIOS, TPS_NAMES, figures, render_table


def _round() -> dict[str, Measurement]:
    return {
        name: Measurement(name, 1_000, False, 10.0, 1_000.0 * (i + 1), 0.5)
        for i, name in enumerate(CONTENDERS)
    }


def test_every_contender_has_a_label_and_a_throughput_name() -> None:
    assert set(LABELS) == set(TPS_NAMES) == set(CONTENDERS)
    assert {"faust", "quix", "per_record", "pipeline", "passthrough"} <= set(CONTENDERS)
    assert all(top in CONTENDERS and bottom in CONTENDERS for _, top, bottom in RATIOS)


def test_the_pipeline_is_compared_with_quix_streams_in_the_table_and_the_json_line() -> None:
    values = figures([_round()], {}, 0.1)
    assert values["quix_tps"] == 1_000.0 * (CONTENDERS.index("quix") + 1)
    assert values["pipeline_vs_quix"] == round(values["pipeline_tps"] / values["quix_tps"], 2)
    table = render_table([_round()], values, 0.1)
    assert LABELS["quix"] in table
    assert "pipeline_vs_quix" in table


def test_every_budget_is_a_figure_the_bench_makes() -> None:
    latencies = {name: {"p99_ms": 1.0, "lost": 0} for name, _, _ in LATENCY_FIGURES}
    values = figures([_round()], latencies, 0.1)
    bounds = json.loads(DEFAULT_BOUNDS.read_text())["bounds"]
    assert {bound["metric"] for bound in bounds} <= set(values)
    assert any(b["metric"] == "pipeline_vs_quix" and b["min"] == 3.0 for b in bounds)
    assert any(b["metric"] == "quix_p99_vs_pipeline" and b["min"] == 2.0 for b in bounds)


def test_quix_streams_p99_is_compared_with_the_pipelines_and_undecided_records_are_shown() -> None:
    latencies = {"pipeline": {"p99_ms": 40.0}, "quix": {"p99_ms": 30_000.0, "lost": 1_234}}
    values = figures([_round()], latencies, 0.1)
    assert values["p99_ms_at_5000_quix"] == 30_000.0
    assert values["quix_p99_vs_pipeline"] == 750.0
    assert values["quix_undecided_at_5000"] == 1_234
    assert values["p99_ms_at_5000_eos"] is None  # not run: not measured, not zero
    table = render_table([_round()], values, 0.1)
    assert "Quix Streams: 30000 ms" in table
    assert "750 (a lower bound: 1,234 Quix records undecided)" in table


def test_without_a_quix_latency_run_there_is_no_ratio() -> None:
    values = figures([_round()], {"pipeline": {"p99_ms": 40.0}}, 0.1)
    assert values["quix_p99_vs_pipeline"] is None
    assert "quix_p99_vs_pipeline" not in render_table([_round()], values, 0.1)
