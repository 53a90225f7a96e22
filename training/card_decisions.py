"""The model card's tables on how the shipped model decides in service: its calibration, its
thresholds and what they flag (on a new stream too), the fallback rules, and the cost of a
scoring call.

These answer "what will it do to my traffic": every figure at the package's own thresholds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scorer.fallback import BASE_LOG_ODDS, CUTOFFS, RED_FLAG_WEIGHTS
from simulator.fraud import DEFAULT_SCENARIOS
from training import gbdt
from training.calibration import Bin
from training.card_cells import percent
from training.cold_start_check import (
    COLD_CHECK_DAYS,
    COLD_CHECK_SEED_OFFSET,
    COLD_START_CHOSEN_ON,
)
from training.fold_data import COLD_START_DAYS
from training.results import Outcomes, TrainingResult

#: Rows/s of `OnnxScorer(model, "cpu", cpu_threads=1).score()` by batch size: (batch, the GEMM
#: graph of fraud-gbdt-2.0.0-3dafe62a, an ensemble of the same size, the traversal graph of
#: fraud-gbdt-2.0.0-c5580da0). Measured with `python -m bench.model_speed --rounds 15` on the
#: 2-vCPU development machine (shared; both graphs in turns, best round), not by the training
#: run. The graph of this package has the same compilation, trees, depth and operators; only its
#: split count (in "Scoring cost") differs: measure again when that changes much.
MEASURED_CPU_ROWS_PER_S: tuple[tuple[int, int, int], ...] = (
    (1, 7_863, 23_521),
    (16, 34_470, 154_383),
    (64, 39_741, 254_640),
    (256, 39_957, 274_330),
    (1024, 41_446, 250_223),
)
_MEASURED_SPLITS = 1684


def reliability_table(run: TrainingResult) -> str:
    """Calibration bins of one run: test weeks beside the validation weeks it was fitted on."""
    lines = [
        "| score | test rows | test frauds | test: mean score | test: fraud rate "
        "| validation rows | validation: mean score | validation: fraud rate |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def rate(value: float) -> str:
        return "n/a" if math.isnan(value) else f"{value:.4f}"

    for test, valid in zip(run.test_reliability, run.validation_reliability, strict=True):
        closing = "]" if test.high == 1.0 else ")"
        lines.append(
            f"| [{test.low:g}, {test.high:g}{closing} | {test.rows:,} | {test.frauds:,} | "
            f"{rate(test.mean_score)} | {rate(test.fraud_rate)} | {valid.rows:,} | "
            f"{rate(valid.mean_score)} | {rate(valid.fraud_rate)} |"
        )
    return "\n".join(lines)


def calibration_by_seed(runs: Sequence[TrainingResult]) -> str:
    """Each seed's Platt parameters and its test weeks' calibration."""
    lines = [
        "| seed | a | b | test: mean score | test: fraud rate | test rows scored 0.5 or more: "
        "fraud rate |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        high = _pooled([b for b in run.test_reliability if b.low >= 0.5])
        lines.append(
            f"| {run.seed} | {run.platt.a:.4f} | {run.platt.b:.4f} | {run.test_mean_score:.4f} "
            f"| {run.test_fraud_rate:.4f} | {high} |"
        )
    return "\n".join(lines)


def _pooled(bins: Sequence[Bin]) -> str:
    rows = sum(b.rows for b in bins)
    frauds = sum(b.frauds for b in bins)
    return f"{frauds / rows:.3f} ({frauds:,} of {rows:,})" if rows else "n/a"


def outcome_table(columns: dict[str, Outcomes], run: TrainingResult) -> str:
    """Per scenario, the shares at or above each threshold, one pair of columns per set of rows."""
    review, decline = run.thresholds
    heads = " | ".join(f"{name}: ≥ {review:g} | ≥ {decline:g}" for name in columns)
    lines = [f"| | {heads} |", "| --- |" + " ---: | ---: |" * len(columns)]
    for scenario in DEFAULT_SCENARIOS:
        label = "legitimate flagged" if scenario == "legit" else f"recall: {scenario}"
        cells = " | ".join(
            f"{percent(outcomes[scenario][0])} | {percent(outcomes[scenario][1])}"
            for outcomes in columns.values()
        )
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)


def thresholds_by_seed(runs: Sequence[TrainingResult]) -> str:
    """Each seed's thresholds, what they flag on its test weeks, and the decline threshold at
    other false-decline costs."""
    lines = [
        "| seed | review | decline | test: legitimate ≥ review | test: legitimate ≥ decline "
        "| decline at a false-decline cost of "
        + ", ".join(f"{cost:g}" for cost in runs[0].decline_by_cost)
        + " |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        legit = run.test_outcomes["legit"]
        others = ", ".join(f"{value:g}" for value in run.decline_by_cost.values())
        lines.append(
            f"| {run.seed} | {run.thresholds.review:g} | {run.thresholds.decline:g} | "
            f"{percent(legit[0])} | {percent(legit[1])} | {others} |"
        )
    return "\n".join(lines)


def cold_start_held_out_note(runs: Sequence[TrainingResult]) -> str:
    """Which cold-check streams shown were looked at when COLD_START_DAYS was chosen."""
    shown = [run.seed + COLD_CHECK_SEED_OFFSET for run in runs]
    looked = [str(seed) for seed in shown if seed in COLD_START_CHOSEN_ON]
    held = [str(seed) for seed in shown if seed not in COLD_START_CHOSEN_ON]
    if not looked:
        return "Every column is held out: none of these streams was looked at for that choice."
    return (
        f"{COLD_START_DAYS} days were chosen looking at the streams of seeds "
        f"{' and '.join(map(str, COLD_START_CHOSEN_ON))}: {_columns(looked)} not held out"
        + (f"; {_columns(held)} held out." if held else ".")
    )


def _columns(seeds: list[str]) -> str:
    return (
        f"seed {seeds[0]}'s column is"
        if len(seeds) == 1
        else (f"the columns of seeds {' and '.join(seeds)} are")
    )


def cold_start_table(runs: Sequence[TrainingResult]) -> str:
    """Each seed's shipped-form model on a new stream, day by day."""
    lines = [
        "| day | " + " | ".join(f"seed {run.seed + COLD_CHECK_SEED_OFFSET}" for run in runs) + " |",
        "| ---: |" + " ---: |" * len(runs),
    ]
    for day in range(COLD_CHECK_DAYS):
        cells = " | ".join(
            f"{percent(run.cold_start[day].legit_review)} / "
            f"{percent(run.cold_start[day].legit_decline)} / "
            f"{percent(run.cold_start[day].fraud_recall)}"
            for run in runs
        )
        lines.append(f"| {day} | {cells} |")
    return "\n".join(lines)


def fallback_rules(run: TrainingResult) -> str:
    """The shipped fallback rules beside this run's fit of them."""
    fit = run.fallback.fit
    lines = [
        "| red flag | shipped: cut-off | shipped: weight | this run's fit: cut-off | weight |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| (none: base log-odds) | | {BASE_LOG_ODDS:g} | | {fit.base_log_odds:.2f} |",
    ]
    for name, weight in RED_FLAG_WEIGHTS.items():
        lines.append(
            f"| {name} | {getattr(CUTOFFS, name):g} | {weight:g} | "
            f"{getattr(fit.cutoffs, name):g} | {fit.weights[name]:.2f} |"
        )
    return "\n".join(lines)


def fallback_by_seed(runs: Sequence[TrainingResult]) -> str:
    """The shipped fallback rules on each seed's test weeks."""
    lines = [
        "| seed | ROC-AUC | legitimate ≥ review | legitimate ≥ decline | "
        + " | ".join(f"recall ≥ review: {name}" for name in DEFAULT_SCENARIOS[1:])
        + " |",
        "| ---: | ---: | ---: | ---: |" + " ---: |" * len(DEFAULT_SCENARIOS[1:]),
    ]
    for run in runs:
        test = run.fallback.test
        cells = " | ".join(percent(test[name][0]) for name in DEFAULT_SCENARIOS[1:])
        lines.append(
            f"| {run.seed} | {run.fallback.test_roc_auc:.3f} | {percent(test['legit'][0])} "
            f"| {percent(test['legit'][1])} | {cells} |"
        )
    return "\n".join(lines)


def cost_section(run: TrainingResult) -> str:
    """The card's section on scoring cost, for the compiled trees; empty for another winner."""
    if run.winner != "gbdt":
        return ""
    shape = gbdt.graph_shape(run.model)
    rows = "\n".join(
        f"| {batch:,} | {before:,} | {after:,} | {after / before:.1f}x |"
        for batch, before, after in MEASURED_CPU_ROWS_PER_S
    )
    return f"""
## Scoring cost

One call runs {shape.nodes} operators: the {shape.trees} trees, padded to perfect trees of
{shape.depth} levels, are walked one level per step for the whole batch, after one comparison per
row of each of the {shape.splits} distinct splits (`training/gbdt.py`); the calibration is in
the leaves and costs nothing. On the CPU, one intra-op thread as the service runs it, the same
compilation of an earlier ensemble of the same size (fraud-gbdt-2.0.0-c5580da0, {_MEASURED_SPLITS}
distinct splits) against the GEMM graph that compiled such an ensemble before
(fraud-gbdt-2.0.0-3dafe62a; rows/s, `python -m bench.model_speed`, 2-vCPU development machine;
not measured again for this package):

| batch | GEMM graph | traversal graph | speed-up |
| ---: | ---: | ---: | ---: |
{rows}
"""
