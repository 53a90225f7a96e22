"""The model card (Markdown) of a training run: deterministic, nothing measured at run time."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx

from contracts.terminal_risk import DELAY_DAYS
from scorer.catalogue import BY_NAME
from scorer.fallback import BASE_LOG_ODDS, CUTOFFS, RED_FLAG_WEIGHTS
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.flag_rate import FLAG_RATE_MARGIN
from scorer.history import HISTORY_FEATURE_NAMES
from simulator.fraud import DEFAULT_SCENARIOS
from simulator.label_regimes import (
    CASE_EXPIRY_MS,
    CHARGEBACK_DELAY_S,
    MAX_CHARGEBACK_DELAY_S,
    REVIEW_WORK_MS,
    REVIEWS_PER_DAY,
    LabelRegime,
)
from training import gbdt, handbook_recipe, mlp
from training.calibration import Bin
from training.onnx_export import INPUT_NAME, IR_VERSION, OPSET, OUTPUT_NAME
from training.protocol import TRAIN_DAYS, Metrics
from training.thresholds import FALSE_DECLINE_COST, REVIEW_LEGIT_SHARE
from training.train import (
    COLD_CHECK_DAYS,
    COLD_CHECK_SEED_OFFSET,
    COLD_START_CHOSEN_ON,
    COLD_START_DAYS,
    FRESH_LABEL_COLUMNS,
    HANDBOOK,
    KNOWN_COMPROMISED_FEATURE,
    MODEL_NAMES,
    FoldResult,
    Outcomes,
    TrainingResult,
    assessed_days,
    mean_std,
    spread,
    validation_days,
)

#: The handbook's published test performance on its own simulated data (chapter 5, "Model
#: selection", the summary table of each model class: test mean +/- standard deviation over its
#: 4 prequential test folds, as printed, each metric at the parameters its validation chose).
PUBLISHED: dict[str, tuple[str, str, str]] = {
    "XGBoost (grid search)": ("0.869 ± 0.01", "0.687 ± 0.01", "0.303 ± 0.01"),
    "random forest": ("0.87 ± 0.02", "0.678 ± 0.01", "0.299 ± 0.01"),
    "logistic regression": ("0.868 ± 0.02", "0.623 ± 0.02", "0.297 ± 0.01"),
}

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

_RECIPE = "handbook recipe (15 features, XGBoost)"
#: The standard normal's 90th percentile.
_Z_90 = 1.2816


def _name(kind: str) -> str:
    return _RECIPE if kind == HANDBOOK else MODEL_NAMES[kind]


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100.0 * value:.1f} %"


def _mean_std(values: tuple[float, float]) -> str:
    mean, std = values
    return f"{mean:.3f}" if math.isnan(std) else f"{mean:.3f} ± {std:.3f}"


def metrics_table(runs: Sequence[TrainingResult]) -> str:
    """Test folds, handbook-comparable rows: our model and the handbook's recipe, each seed's
    mean over its folds, then the mean ± sample standard deviation over the seeds; beside it,
    the sample standard deviation of AP over every fold of every seed."""
    seeds = ", ".join(str(run.seed) for run in runs)
    lines = [
        f"| model | ROC-AUC | average precision | Card Precision@100 | per seed ({seeds}): AP "
        "| AP, ± over folds |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind in ("ours", HANDBOOK):
        per_seed = {
            field: [mean_std(_test(run, kind), field)[0] for run in runs]
            for field in Metrics._fields
        }
        every_fold = [fold.handbook.average_precision for run in runs for fold in _test(run, kind)]
        name = f"{runs[0].model_name} (our recipe)" if kind == "ours" else _RECIPE
        cells = [_mean_std(spread(per_seed[field])) for field in Metrics._fields]
        ap = " / ".join(f"{v:.3f}" for v in per_seed["average_precision"])
        lines.append(f"| {name} | {' | '.join(cells)} | {ap} | {_mean_std(spread(every_fold))} |")
    return "\n".join(lines)


def regime_table(by_regime: dict[LabelRegime, Sequence[TrainingResult]]) -> str:
    """Per label regime, the test folds' handbook-comparable rows: our model and the handbook's
    recipe trained and scored on the same rows (mean ± sample standard deviation over the
    seeds of each seed's mean over its folds), each one's recall and legitimate share at its
    own review threshold over all test rows, and AP ours minus the recipe's, seed by seed."""
    lines = [
        "| regime | model | ROC-AUC | average precision | Card Precision@100 | recall at review "
        "| legitimate at review | AP, ours - recipe |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for regime, runs in by_regime.items():
        gain = [
            mean_std(_test(run, "ours"), "average_precision")[0]
            - mean_std(_test(run, HANDBOOK), "average_precision")[0]
            for run in runs
        ]
        for kind in ("ours", HANDBOOK):
            cells = [
                _mean_std(spread([mean_std(_test(run, kind), field)[0] for run in runs]))
                for field in Metrics._fields
            ]
            at_review = [run.test_at_review[run.winner if kind == "ours" else kind] for run in runs]
            cells.append(_mean_std(spread([at.fraud_recall for at in at_review])))
            cells.append(_percent(float(np.mean([at.legit_share for at in at_review]))))
            cells.append(_mean_std(spread(gain)) if kind == "ours" else "")
            name = runs[0].model_name if kind == "ours" else _RECIPE
            lines.append(f"| {regime.value} | {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _regimes_section(
    run: TrainingResult, by_regime: dict[LabelRegime, Sequence[TrainingResult]]
) -> str:
    median_s, sigma = CHARGEBACK_DELAY_S
    seeds = ", ".join(str(r.seed) for r in by_regime[run.regime])
    ninetieth_days = median_s * math.exp(_Z_90 * sigma) / 86_400
    return f"""### How outcomes reach the model: label regimes

A model learns from the outcomes it is told, and its fresh-label features (a terminal's or a
card's frauds confirmed so far) are only as quick as they are. The simulator reports outcomes
under a named regime (`simulator/label_regimes.py`):

- **today**: the simulator's own outcomes. 35 % of frauds are confirmed by an analyst about 4
  hours after the transaction, whether or not anything flagged it; the rest by chargebacks
  (median 2.5 days); 0.5 % of legitimate transactions are confirmed legitimate. Optimistic:
  kept for comparison.
- **chargebacks**: every fraud is reported by a chargeback, after a log-normal delay (median
  {median_s / 86_400:g} days, sigma of the log {sigma:g}: 90 % within {ninetieth_days:.0f} days; \
at most {MAX_CHARGEBACK_DELAY_S / 86_400:g} days).
  Nothing else is ever labelled.
- **capacity**: analysts review only what the rules flag (`scorer/fallback.py`: a transaction
  with a red flag; rules, not a model, so that the regime exists before the model it trains).
  They review {REVIEWS_PER_DAY} cases a day (the handbook's premise behind Card Precision@100), \
each hour its
  share, highest expected loss (score \u00d7 amount) first; a case not reached within \
{CASE_EXPIRY_MS // 3_600_000} hours
  is left to chargebacks. They also review a random {100 * run.audit_share:g} % of unflagged \
transactions, as
  issuers do to measure what they miss. A review's outcome, fraud or legitimate, is reported
  within {REVIEW_WORK_MS // 60_000} minutes after the hour it was reviewed in. Every other \
fraud is reported by a
  chargeback, as above.

Under chargebacks and capacity, a model learns as fraud only the frauds reported before it goes
live (the first day of the week it is assessed on): a fraud not reported by then reads as
legitimate, as it does to a team that retrains. Under today's regime every fraud of the
training week counts, as the handbook's protocol assumes. Every figure is assessed against
every outcome (the truth the simulator knows).

The table gives each seed's mean over its test folds, then the mean ± sample standard
deviation over seeds {seeds}. ROC-AUC, AP and Card Precision@100 are on the handbook-comparable
rows. Recall and the legitimate share at the review threshold are over all test rows; each
recipe's threshold is chosen on its own validation scores by the same rule (at most \
{REVIEW_LEGIT_SHARE:.0%} of
legitimate validation rows at or above it). The last column is our AP minus the recipe's, seed
by seed. Within a regime both recipes
are scored on the same rows. The rows differ from one regime to the next: a row whose card the
features already know to be compromised is left out (below), and how soon that is known
depends on the regime. The shipped model is the first line's: **{run.regime.value}**.

{regime_table(by_regime)}"""


def _fresh_label_note(run: TrainingResult) -> str:
    if not run.without_fresh_labels:
        return ""
    columns = ", ".join(f"`{name}`" for name in FRESH_LABEL_COLUMNS)
    rows = []
    for name, folds in (
        (f"{run.model_name} (our recipe)", run.test[run.winner]),
        (f"{run.model_name} without {columns}", run.without_fresh_labels),
        (_RECIPE, run.test[HANDBOOK]),
    ):
        cells = " | ".join(_mean_std(mean_std(folds, field)) for field in Metrics._fields)
        rows.append(f"| {name} | {cells} |")
    table = "\n".join(rows)
    return f"""
Much of the difference comes from {len(FRESH_LABEL_COLUMNS)} columns that the handbook's setting
has no counterpart for: {columns}, the frauds at the terminal and on the card confirmed so far,
without the delay (the handbook assumes outcomes arrive after it). The assessed rows leave out
every card with a fraud confirmed on the last 7 days, so the card's two columns are 0 on them
and this mostly measures the terminal's. The chosen candidate trained and scored without them,
on the same test folds of seed {run.seed} (mean ± standard deviation over its
{len(run.test[HANDBOOK])} folds; its scores computed in numpy, the arithmetic of the exported
graph, not exported):

| model, seed {run.seed} | ROC-AUC | average precision | Card Precision@100 |
| --- | ---: | ---: | ---: |
{table}
"""


def _test(run: TrainingResult, kind: str) -> list[FoldResult]:
    return run.test[run.winner if kind == "ours" else kind]


def _published_table() -> str:
    lines = [
        "| handbook, its own data (published) | ROC-AUC | average precision | Card Precision@100 |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {name} | {' | '.join(cells)} |" for name, cells in PUBLISHED.items()]
    return "\n".join(lines)


def _validation_vs_test(runs: Sequence[TrainingResult]) -> str:
    lines = [
        "| seed | model | validation: AUC / AP / CP@100 | test: AUC / AP / CP@100 |",
        "| ---: | --- | ---: | ---: |",
    ]
    for run in runs:
        for kind in (*MODEL_NAMES, HANDBOOK):
            validation = " / ".join(
                f"{mean_std(run.validation[kind], field)[0]:.3f}" for field in Metrics._fields
            )
            if kind in run.test:
                test = " / ".join(
                    f"{mean_std(run.test[kind], field)[0]:.3f}" for field in Metrics._fields
                )
            else:
                test = "not tested (not chosen)"
            chosen = " **(chosen)**" if kind == run.winner else ""
            lines.append(f"| {run.seed} | {_name(kind)}{chosen} | {validation} | {test} |")
    return "\n".join(lines)


def _fold_table(run: TrainingResult) -> str:
    lines = [
        "| folds | model | training week starts | assessed week | handbook scenarios: AUC / AP / "
        "CP@100 | all four: AUC / AP / CP@100 |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for folds, by_kind in (("validation", run.validation), ("test", run.test)):
        for kind, results in by_kind.items():
            for fold in results:
                handbook = " / ".join(f"{v:.3f}" for v in fold.handbook)
                everything = " / ".join(f"{v:.3f}" for v in fold.everything)
                first, last = assessed_days(fold.train_start_day)
                lines.append(
                    f"| {folds} | {_name(kind)} | day {fold.train_start_day} | days {first}-{last} "
                    f"| {handbook} | {everything} |"
                )
    return "\n".join(lines)


def _reliability_table(run: TrainingResult) -> str:
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


def _calibration_by_seed(runs: Sequence[TrainingResult]) -> str:
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


def _outcome_table(columns: dict[str, Outcomes], run: TrainingResult) -> str:
    review, decline = run.thresholds
    heads = " | ".join(f"{name}: ≥ {review:g} | ≥ {decline:g}" for name in columns)
    lines = [f"| | {heads} |", "| --- |" + " ---: | ---: |" * len(columns)]
    for scenario in DEFAULT_SCENARIOS:
        label = "legitimate flagged" if scenario == "legit" else f"recall: {scenario}"
        cells = " | ".join(
            f"{_percent(outcomes[scenario][0])} | {_percent(outcomes[scenario][1])}"
            for outcomes in columns.values()
        )
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)


def _thresholds_by_seed(runs: Sequence[TrainingResult]) -> str:
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
            f"{_percent(legit[0])} | {_percent(legit[1])} | {others} |"
        )
    return "\n".join(lines)


def _held_out(runs: Sequence[TrainingResult]) -> str:
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


def _cold_start_table(runs: Sequence[TrainingResult]) -> str:
    lines = [
        "| day | " + " | ".join(f"seed {run.seed + COLD_CHECK_SEED_OFFSET}" for run in runs) + " |",
        "| ---: |" + " ---: |" * len(runs),
    ]
    for day in range(COLD_CHECK_DAYS):
        cells = " | ".join(
            f"{_percent(run.cold_start[day].legit_review)} / "
            f"{_percent(run.cold_start[day].legit_decline)} / "
            f"{_percent(run.cold_start[day].fraud_recall)}"
            for run in runs
        )
        lines.append(f"| {day} | {cells} |")
    return "\n".join(lines)


def _fallback_rules(run: TrainingResult) -> str:
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


def _fallback_by_seed(runs: Sequence[TrainingResult]) -> str:
    lines = [
        "| seed | ROC-AUC | legitimate ≥ review | legitimate ≥ decline | "
        + " | ".join(f"recall ≥ review: {name}" for name in DEFAULT_SCENARIOS[1:])
        + " |",
        "| ---: | ---: | ---: | ---: |" + " ---: |" * len(DEFAULT_SCENARIOS[1:]),
    ]
    for run in runs:
        test = run.fallback.test
        cells = " | ".join(_percent(test[name][0]) for name in DEFAULT_SCENARIOS[1:])
        lines.append(
            f"| {run.seed} | {run.fallback.test_roc_auc:.3f} | {_percent(test['legit'][0])} "
            f"| {_percent(test['legit'][1])} | {cells} |"
        )
    return "\n".join(lines)


def operators(model: bytes) -> list[str]:
    """The operator types of a serialized model, in the order they first appear."""
    graph = onnx.load_from_string(model).graph
    return list(dict.fromkeys(node.op_type for node in graph.node))


def _cost_section(run: TrainingResult) -> str:
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


def _span(starts: Sequence[int]) -> str:
    return f"days {assessed_days(min(starts))[0]}-{assessed_days(max(starts))[1]}"


def render_model_card(
    runs: Sequence[TrainingResult], by_regime: dict[LabelRegime, Sequence[TrainingResult]]
) -> str:
    """The model card of a training run: the first run's model ships, every run is reported;
    `by_regime` (the runs' own regime among them) gives the regime table."""
    run = runs[0]
    seeds = ", ".join(str(r.seed) for r in runs)
    features = "\n".join(
        f"| {i} | `{name}` | {BY_NAME[name].description} |" for i, name in enumerate(FEATURE_NAMES)
    )
    recipe_columns = "\n".join(
        f"| `{theirs}` | `{ours}` | {BY_NAME[ours].description} |"
        for theirs, ours in handbook_recipe.FEATURES
    )
    layers = " → ".join(map(str, (NUM_FEATURES, *mlp.HIDDEN_SIZES)))
    counts = ", ".join(f"{name} {run.scenario_rows[name]}" for name in DEFAULT_SCENARIOS)
    ops = ", ".join(f"`{op}`" for op in operators(run.model))
    first_valid, last_valid = validation_days(run.schedule)
    folds = len(run.schedule.test)
    review, decline = run.thresholds
    low, high = run.expected_flag_rate
    valid_ap = {
        kind: mean_std(run.validation[kind], "average_precision")[0] for kind in MODEL_NAMES
    }
    winners = {r.winner for r in runs}
    valid_rows = sum(b.rows for b in run.validation_reliability)
    valid_frauds = sum(b.frauds for b in run.validation_reliability)
    shipped_test = run.test_outcomes
    recipe_params = ", ".join(f"{key}={value}" for key, value in handbook_recipe.PARAMS.items())
    return f"""# Model card: {run.model_name}

| | |
| --- | --- |
| model_version | `{run.model_version}` |
| package | `scorer/models/{run.model_name}/`: `model.onnx` (ONNX, opset {OPSET}, IR \
version {IR_VERSION}), its manifest `model.toml` (docs/models.md) and this card |
| input | `{INPUT_NAME}`: float32 `[batch, {NUM_FEATURES}]`, raw `build_features` output |
| output | `{OUTPUT_NAME}`: float32 `[batch]`, probability of fraud, calibrated (Platt scaling, \
below) |
| thresholds | review from {review:g}, decline from {decline:g} (chosen on the validation \
weeks, below) |
| operators | {ops}: all with CUDA and CPU kernels in ONNX Runtime (no `ai.onnx.ml`) |
| labels | trained and tested under the **{run.regime.value}** label regime (Evaluation, \
How outcomes reach the model) |

## What it is

The fraud model the `fraud-scorer` service ships with. It scores a transaction from its own
fields, its card's history (`scorer/history.py`, kept per partition by the service), its
terminal's confirmed frauds (`scorer/terminal_risk.py`, from the `labels` feedback: risk over
windows that end the handbook's {DELAY_DAYS} days back, and the frauds confirmed so far on the
last 2 and 7 days) and its card's confirmed frauds so far on the same days
(`scorer/card_frauds.py`). It was trained only on simulated traffic.

Two candidates were trained on the same validation folds: gradient-boosted trees (LightGBM,
{gbdt.NUM_TREES} trees of at most {gbdt.PARAMS["num_leaves"]} leaves, compiled to tensor
operations as Hummingbird's PerfectTreeTraversal strategy does) and an MLP ({layers} → 1).
**{run.model_name}** had the higher mean average precision on the validation folds
({valid_ap[run.winner]:.3f} against {valid_ap["mlp" if run.winner == "gbdt" else "gbdt"]:.3f},
seed {run.seed}; chosen on every seed: {", ".join(MODEL_NAMES[w] for w in sorted(winners))}).
The test folds played no part in that choice.

## Intended use

Scoring micro-batches in the service with the package's thresholds: `review` from {review:g},
`decline` from {decline:g}. The score is a probability of fraud, calibrated on simulated
traffic that precedes the test weeks; read it as "about this share of such transactions were
fraud" on that traffic, not on real payments. Not a model for real payments.

## Evaluation

The protocol of Le Borgne et al., *Reproducible Machine Learning for Credit Card Fraud
Detection* (chapters 3-5): a training week, a {DELAY_DAYS}-day delay, an assessment week from
which the cards already known to be compromised are removed (by the handbook's rule, and every
row whose card the service's own features know to be compromised when it scores it,
`{KNOWN_COMPROMISED_FEATURE}` > 0: a fraud of the card confirmed, within hours of it, in that
window; such a row tests what serving already knows, not the model); ROC-AUC, average precision and
Card Precision@100 (per day, the 100 cards with the highest score, cards caught on earlier days
removed). Its model-selection schedule (chapter 5), on one stream of {run.days} days per seed:

| folds (seed {run.seed}) | training weeks start | assessed weeks | what they are for |
| --- | --- | --- | --- |
| {folds} validation | days {", ".join(map(str, sorted(run.schedule.validation)))} | \
{_span(run.schedule.validation)} | every choice: the candidate, its calibration, \
the thresholds, the fallback rules' fit |
| {folds} test | days {", ".join(map(str, sorted(run.schedule.test)))} | \
{_span(run.schedule.test)} | scored once, with the chosen and calibrated model; \
reported only |

The latest validation week is the earliest test fold's training week, so every validation row
precedes every test week, and no figure below comes from a week that was used for a choice. The
first {min(run.schedule.validation)} days are warm-up (windows and compromises reach their
steady state); the first {COLD_START_DAYS} of them also train every fold (Cold start, under
Thresholds). Each figure comes from the exported ONNX model's scores on ONNX Runtime (CPU),
i.e. the model the service runs; the handbook recipe's from XGBoost itself.

{_regimes_section(run, by_regime)}

### Our model and the handbook's recipe, on the same data and folds

The handbook's recipe (`training/handbook_recipe.py`): its 15 features (chapter 3, "Baseline
feature transformation") and the XGBoost its chapter 5 chose for average precision, {recipe_params}
(XGBoost 1.x's defaults for the rest), trained on the same rows as ours (each fold's training
week and the stream's first {COLD_START_DAYS} days) and scored on the same rows. Test folds,
handbook-comparable rows (legitimate traffic and the handbook's three scenarios; this
project's fourth, card testing, left out); each seed's mean over its {folds} test folds, then
the mean ± sample standard deviation (ddof=1) over seeds {seeds}; the last column is the spread
of AP over all {folds * len(runs)} folds, the more honest uncertainty (weeks differ more than
seeds):

{metrics_table(runs)}
{_fresh_label_note(run)}
Validation against test, each seed's mean over its folds (the MLP was not chosen, so its test
folds were never scored):

{_validation_vs_test(runs)}

For context only, the handbook's published test figures (chapter 5, "Model selection": its own
simulated dataset, its features, 4 test folds, mean ± standard deviation as printed there). They
are not comparable with the rows above: other data.

{_published_table()}

The handbook recipe's columns, as this project computes them:

| handbook | catalogue column | here |
| --- | --- | --- |
{recipe_columns}

They differ from the handbook's: amounts and counts are log(1 + x) (no difference to trees: a
split on log(1 + x) is a split on x); the card windows are exponentially decayed counts and sums
(time constant = the window), not sliding windows; the night is 00:00-05:00 UTC, not 00:00-06:59;
terminal risk counts the frauds that the `labels` feedback confirmed before the transaction, in
daily buckets ending {DELAY_DAYS} days before its day, not every fraud of a sliding window.

Every fold of seed {run.seed}, handbook-comparable rows and all four scenarios:

{_fold_table(run)}

## Calibration

The model's log-odds z are mapped to p = sigmoid(a·z + b) (Platt scaling,
`training/calibration.py`), a and b fitted by maximum likelihood on the chosen candidate's
scores of the {folds} validation weeks (days {first_valid}-{last_valid}, {valid_rows:,} rows,
{valid_frauds:,} frauds, all four scenarios; seed {run.seed}: a = {run.platt.a:.4f}, b =
{run.platt.b:.4f}). It is baked into the trees' leaves, so the graph is unchanged and rankings
do not change. Reliability on the {folds} held-out test weeks (seed {run.seed}, all rows), beside
the validation weeks it was fitted on:

{_reliability_table(run)}

Every seed:

{_calibration_by_seed(runs)}

## Thresholds

Chosen on the validation weeks' calibrated scores (`training/thresholds.py`), from goals:

- **review from {review:g}**: the lowest score at which at most {REVIEW_LEGIT_SHARE:.0%} of
  legitimate transactions reach review or decline (the review team's capacity).
- **decline from {decline:g}**: the score, at or above review, with the lowest cost on the
  validation weeks when declining a legitimate transaction costs {FALSE_DECLINE_COST:g} (an
  assumed figure in the amounts' currency: lost margin, a support contact, a customer who may
  leave) and a fraud not declined costs its amount (a reviewed fraud counts as lost: the
  cautious side). Per transaction that rule would decline when p * amount > (1 - p) *
  {FALSE_DECLINE_COST:g}, a cut that moves with the amount; the service has one decline threshold
  (and `FRAUD_RULES` expressions cannot read the score), so the one threshold with the lowest
  total cost is taken.

Outcomes at these thresholds, seed {run.seed}: the validation weeks (where they were chosen) and
the test weeks (all rows, known-compromised cards removed):

{_outcome_table({"validation": run.validation_outcomes, "test": shipped_test}, run)}

**Expected flag rate.** The manifest states the share of all decisions at review or decline
that live traffic should stay within at these thresholds: {_percent(low)} to {_percent(high)}
(`[thresholds] expected_flag_rate`), the lowest and highest daily share over every row of the
validation weeks (known-compromised cards included, as serving sees them), divided and
multiplied by {FLAG_RATE_MARGIN:g} (`scorer/flag_rate.py`). A replica exports it as
`fraud_model_expected_flag_ratio`, and `FraudFlagRateUnexpected` fires when an hour's live share
leaves it: a model put on traffic it does not fit flags far more, or far less, than it was
chosen to (docs/runbooks.md).

Every seed (each chose its own thresholds on its own validation weeks):

{_thresholds_by_seed(runs)}

**Cold start.** A service that starts, and every new card, has no history: the windows fill
over the first days. The validation and test weeks come after
{min(run.schedule.validation)} days of warm-up, so every fold also trains on the stream's first
{COLD_START_DAYS} days (`training_rows` in
`training/train.py`); a model trained on its training week alone flagged 6-8 % of legitimate
transactions on a new stream's first day and 3 % over its first 10 (1 % in steady state). Each
seed's shipped-form model on a stream it never saw (seed + {COLD_CHECK_SEED_OFFSET}, every card
and terminal new on day 0), day by day: legitimate ≥ review / legitimate ≥ decline / fraud
recall at review. {_held_out(runs)}

{_cold_start_table(runs)}

**Setting your own.** The manifest's `[thresholds]` are defaults: `FRAUD_REVIEW_THRESHOLD` and
`FRAUD_DECLINE_THRESHOLD` override them for a deployment, a `[[override]]` in `FRAUD_RULES`
sets them per segment (docs/rules.md), and a package of your own states its own in its
`model.toml`. As the score is a probability, a team can work from its own figures: with a
false-decline cost C, declining a transaction of amount A pays from p > C / (A + C); for review,
take the score that sends your review team as many transactions as it can handle on recent
traffic (the table above gives the share of legitimate traffic each threshold flags).

## Fallback rules

When the model is late or unavailable, `scorer/fallback.py` decides: a logistic model on a few
red flags read from the same feature matrix, its score a probability read against the same
thresholds. Its cut-offs and weights (log-odds) were fitted on seed 7's validation weeks
(`training/fallback_fit.py`); this run's fit on its own validation weeks is shown beside them:

{_fallback_rules(run)}

Outcomes of the shipped rules at the package's thresholds, seed {run.seed}:

{_outcome_table({"validation": run.fallback.validation, "test": run.fallback.test}, run)}

Every seed, test weeks:

{_fallback_by_seed(runs)}

The compromised-terminal scenario is the hard one, for the model as for the rules and as in the
handbook: its frauds look like ordinary purchases, and only confirmed outcomes at the terminal
reveal it, so the frauds of a compromise before the first of them is confirmed go undetected by
design.
{_cost_section(run)}
## Training data

- `simulator.transactions.TransactionSimulator`, seed {run.seed}: the handbook's world (5,000
  customers, 10,000 terminals on a 100 x 100 grid, radius 5; amounts N(μ, μ/2) with μ ~
  U(5, 100); Poisson(U(0, 4)) transactions a day around noon) and its three fraud scenarios,
  plus card testing; {run.days} simulated days, {run.rows} transactions, {run.fraud_rows}
  of them fraud ({counts}); {run.labels} outcomes reported (`labels`) within those days.
- Features: the stream replayed in event-time order, in batches of 256, through the service's
  own `CardHistory`, terminal-risk buckets (fed with the outcomes when they were reported) and
  `build_features` (`simulator/replay.py`): the model sees exactly what the service computes.
- Shipped model: trained on the stream's first {COLD_START_DAYS} days (cold start, above) and
  the latest test fold's training week (days
  {run.schedule.test[0]}-{run.schedule.test[0] + TRAIN_DAYS - 1}), {run.train_rows}
  transactions in all, calibrated as above; its test week has {run.test_rows} rows.

## Features

| # | name | meaning |
| --- | --- | --- |
{features}

History windows are exponentially decayed counts and sums (time constant = the window), so the
state per card is fixed-size; see `scorer/history.py`. A transaction without history (a new
card, or any card when the caller has none) gets the values of a card seen for the first time;
a terminal without a `terminal-risk` record gets zeros, as in the handbook.

## Limitations

- Simulated data only: the figures say how well the model learned the simulator, beside the
  handbook's recipe on the same simulator, not how it would do on real payments.
- The calibration holds for traffic like the validation weeks': a shift in the fraud rate or
  the mix of scenarios moves it. Refit it (retrain) as the traffic drifts.
- The history has {len(HISTORY_FEATURE_NAMES)} columns that the service must keep per partition;
  without them (`build_features(columns)` alone) the model sees every card as new and the
  terminal as unknown, and its recall falls to what the transaction alone shows.
- Trained on one week of steady traffic, as the protocol prescribes, and the stream's first
  {COLD_START_DAYS} days; retrain as the traffic drifts.

## How to retrain

From the repository root, with the `train` extra installed: `make model`, or

```
python -m training --seeds {",".join(str(r.seed) for r in runs)} --days {run.days} --folds {folds}
```

It rewrites the package `scorer/models/{run.model_name}/` (model, manifest, this card) from the
first seed's run; the same arguments reproduce all three byte for byte on the same platform.
"""
