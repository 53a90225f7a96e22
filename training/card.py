"""The model card (Markdown) of a training run: deterministic, nothing measured at run time."""

from __future__ import annotations

import math

import onnx

from scorer.catalogue import BY_NAME
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.history import HISTORY_FEATURE_NAMES
from scorer.terminal_risk import DELAY_DAYS
from simulator.fraud import SCENARIOS
from training import gbdt, mlp
from training.onnx_export import INPUT_NAME, IR_VERSION, OPSET, OUTPUT_NAME
from training.train import (
    DECLINE_THRESHOLD,
    MODEL_NAMES,
    REVIEW_THRESHOLD,
    TARGET_REVIEW_RATE,
    WARMUP_DAYS,
    TrainingResult,
)

#: The handbook's test performance (chapter 5, model selection: prequential, 4 folds).
HANDBOOK_BASELINES: dict[str, tuple[float, float, float]] = {
    "XGBoost, tuned (handbook)": (0.872, 0.687, 0.303),
    "random forest (handbook)": (0.870, 0.678, 0.299),
    "logistic regression (handbook)": (0.871, 0.606, 0.291),
}

#: Rows/s of `OnnxScorer(model, "cpu", cpu_threads=1).score()` by batch size: (batch, the GEMM
#: graph of fraud-gbdt-2.0.0-3dafe62a, an ensemble of the same size, the shipped traversal graph).
#: Measured with `python -m bench.model_speed --rounds 15` on the 2-vCPU development machine
#: (shared; both graphs in turns, best round), not by the training run: measure again when the
#: trees or the graph change (last: fraud-gbdt-2.0.0-c5580da0).
MEASURED_CPU_ROWS_PER_S: tuple[tuple[int, int, int], ...] = (
    (1, 7_863, 23_521),
    (16, 34_470, 154_383),
    (64, 39_741, 254_640),
    (256, 39_957, 274_330),
    (1024, 41_446, 250_223),
)


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100.0 * value:.1f} %"


def metrics_table(result: TrainingResult) -> str:
    """The handbook-protocol table: both candidates beside the handbook's baselines."""
    lines = [
        "| model | ROC-AUC | average precision | Card Precision@100 |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind, candidate in result.candidates.items():
        cells = [
            "{:.3f} ± {:.3f}".format(*candidate.mean(field))
            for field in ("roc_auc", "average_precision", "card_precision")
        ]
        shipped = " **(shipped)**" if kind == result.winner else ""
        lines.append(f"| {MODEL_NAMES[kind]}{shipped} | {' | '.join(cells)} |")
    for name, (auc, ap, cp) in HANDBOOK_BASELINES.items():
        lines.append(f"| {name} | {auc:.3f} ± 0.01 | {ap:.3f} ± 0.01 | {cp:.3f} ± 0.01 |")
    return "\n".join(lines)


def _fold_table(result: TrainingResult) -> str:
    lines = [
        "| model | training week starts | test week | handbook scenarios: AUC / AP / CP@100 "
        "| all four: AUC / AP / CP@100 |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, candidate in result.candidates.items():
        for fold in candidate.folds:
            handbook = " / ".join(f"{v:.3f}" for v in fold.handbook)
            everything = " / ".join(f"{v:.3f}" for v in fold.everything)
            start = fold.train_start_day
            lines.append(
                f"| {MODEL_NAMES[kind]} | day {start} | days {start + 14}-{start + 20} "
                f"| {handbook} | {everything} |"
            )
    return "\n".join(lines)


def _recall_table(result: TrainingResult) -> str:
    lines = [
        f"| latest test week | {MODEL_NAMES[result.winner]}: score ≥ {REVIEW_THRESHOLD} "
        f"(review) | ≥ {DECLINE_THRESHOLD} (decline) |",
        "| --- | ---: | ---: |",
    ]
    shipped = result.candidates[result.winner]
    for name in SCENARIOS[1:]:
        review, decline = shipped.recall[name]
        lines.append(f"| recall: {name} | {_percent(review)} | {_percent(decline)} |")
    review, decline = shipped.false_positive_rate
    lines.append(f"| flagged: legit | {_percent(review)} | {_percent(decline)} |")
    return "\n".join(lines)


def operators(model: bytes) -> list[str]:
    """The operator types of a serialized model, in the order they first appear."""
    graph = onnx.load_from_string(model).graph
    return list(dict.fromkeys(node.op_type for node in graph.node))


def _cost_section(result: TrainingResult) -> str:
    if result.winner != "gbdt":
        return ""
    shape = gbdt.graph_shape(result.model)
    rows = "\n".join(
        f"| {batch:,} | {before:,} | {after:,} | {after / before:.1f}x |"
        for batch, before, after in MEASURED_CPU_ROWS_PER_S
    )
    return f"""
## Scoring cost

One call runs {shape.nodes} operators: the {shape.trees} trees, padded to perfect trees of
{shape.depth} levels, are walked one level per step for the whole batch, after one comparison per
row of each of the {shape.splits} distinct splits (`training/gbdt.py`). On the CPU, one intra-op
thread as the service runs it, against the GEMM graph that compiled an ensemble of the same
size before (fraud-gbdt-2.0.0-3dafe62a; rows/s, `python -m bench.model_speed`, 2-vCPU
development machine):

| batch | GEMM graph | this graph | speed-up |
| ---: | ---: | ---: | ---: |
{rows}
"""


def render_model_card(result: TrainingResult, folds: int) -> str:
    """The model card of a training run."""
    features = "\n".join(
        f"| {i} | `{name}` | {BY_NAME[name].description} |" for i, name in enumerate(FEATURE_NAMES)
    )
    shipped, other = (
        result.candidates[result.winner],
        result.candidates["mlp" if result.winner == "gbdt" else "gbdt"],
    )
    layers = " → ".join(map(str, (NUM_FEATURES, *mlp.HIDDEN_SIZES)))
    ap_gain = shipped.mean("average_precision")[0] - other.mean("average_precision")[0]
    counts = ", ".join(f"{name} {result.scenario_rows[name]}" for name in SCENARIOS)
    ops = ", ".join(f"`{op}`" for op in operators(result.model))
    return f"""# Model card: {result.model_name}

| | |
| --- | --- |
| model_version | `{result.model_version}` |
| package | `scorer/models/{result.model_name}/`: `model.onnx` (ONNX, opset {OPSET}, IR \
version {IR_VERSION}), its manifest `model.toml` (docs/models.md) and this card |
| input | `{INPUT_NAME}`: float32 `[batch, {NUM_FEATURES}]`, raw `build_features` output |
| output | `{OUTPUT_NAME}`: float32 `[batch]`, fraud score in [0, 1] |
| operators | {ops}: all with CUDA and CPU kernels in ONNX Runtime (no `ai.onnx.ml`) |

## What it is

The fraud model the `fraud-scorer` service ships with. It scores a transaction from its own
fields, its card's history (`scorer/history.py`, kept per partition by the service) and its
terminal's confirmed-fraud risk (`scorer/terminal_risk.py`, from the `labels` feedback with the
handbook's {DELAY_DAYS}-day delay). It was trained only on simulated traffic.

Two candidates were trained on the same folds: gradient-boosted trees (LightGBM,
{gbdt.NUM_TREES} trees of at most {gbdt.PARAMS["num_leaves"]} leaves, compiled to tensor
operations as Hummingbird's PerfectTreeTraversal strategy does) and an MLP ({layers} → 1).
The shipped one, **{MODEL_NAMES[result.winner]}**, has the higher mean average precision on
the handbook-comparable test rows, by {ap_gain:+.3f}.

## Intended use

Scoring micro-batches in the service with the default thresholds: `review` from
{REVIEW_THRESHOLD}, `decline` from {DECLINE_THRESHOLD}. The score is shifted on the log-odds
(rankings do not change) so that {TARGET_REVIEW_RATE:.1%} of the training week's legitimate
transactions reach the review threshold; read it as a ranking with thresholds tuned to it, not as a
calibrated probability. Not a model for real payments.

## Evaluation: the handbook's protocol

The protocol of Le Borgne et al., *Reproducible Machine Learning for Credit Card Fraud
Detection* (chapters 3-5): a training week, a {DELAY_DAYS}-day delay, a test week from
which the cards already known to be compromised are removed; ROC-AUC, average precision and Card
Precision@100 (per day, the 100 cards with the highest score, cards caught on earlier days
removed). As in the handbook's model selection, {folds} prequential folds a week apart; mean ±
standard deviation over the folds. Each figure is computed from the exported ONNX model's scores
on ONNX Runtime (CPU), i.e. the model the service runs.

Handbook-comparable rows (test rows of the handbook's three scenarios and legitimate traffic;
this project's fourth scenario, card testing, left out), beside the handbook's published test
performance (chapter 5, "Model selection", whose ± is about 0.01):

{metrics_table(result)}

Every fold, handbook-comparable and with all four scenarios:

{_fold_table(result)}

Recall per scenario and share of legitimate traffic flagged at the default thresholds, on the
latest test week (all rows, known-compromised cards removed):

{_recall_table(result)}

The compromised-terminal scenario is the hard one, as in the handbook: its terminals' frauds
become visible to the risk features only once confirmed outcomes older than the delay exist, so
about the first week of each 28-day compromise goes undetected by design.
{_cost_section(result)}
## Training data

- `simulator.transactions.TransactionSimulator`, seed {result.seed}: the handbook's world (5,000
  customers, 10,000 terminals on a 100 x 100 grid, radius 5; amounts N(μ, μ/2) with μ ~
  U(5, 100); Poisson(U(0, 4)) transactions a day around noon) and its three fraud scenarios,
  plus card testing; {result.days} simulated days, {result.rows} transactions, {result.fraud_rows}
  of them fraud ({counts}); {result.labels} outcomes reported (`labels`) within those days.
- Features: the stream replayed in event-time order, in batches of 256, through the service's
  own `CardHistory`, terminal-risk buckets (fed with the outcomes when they were reported) and
  `build_features` (`training/replay.py`): the model sees exactly what the service computes.
- First {WARMUP_DAYS} days: warm-up only (windows and compromises reach their steady state).
- Shipped model: trained on the latest fold's training week ({result.train_rows} transactions);
  its test week has {result.test_rows} rows.

## Features

| # | name | meaning |
| --- | --- | --- |
{features}

History windows are exponentially decayed counts and sums (time constant = the window), so the
state per card is fixed-size; see `scorer/history.py`. A transaction without history (a new
card, or any card when the caller has none) gets the values of a card seen for the first time;
a terminal without a `terminal-risk` record gets zeros, as in the handbook.

## Limitations

- Simulated data only: the figures say how well the model learned the simulator, compared on
  the handbook's own terms, not how it would do on real payments.
- The history has {len(HISTORY_FEATURE_NAMES)} columns that the service must keep per partition;
  without them (`build_features(columns)` alone) the model sees every card as new and the
  terminal as unknown, and its recall falls to what the transaction alone shows.
- Trained on one week, as the protocol prescribes; retrain as the traffic drifts.

## How to retrain

From the repository root, with the `train` extra installed: `make model`, or

```
python -m training --seed {result.seed} --days {result.days} --folds {folds}
```

It rewrites the package `scorer/models/{result.model_name}/` (model, manifest, this card); the
same arguments reproduce all three byte for byte on the same platform.
"""
