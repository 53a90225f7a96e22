"""The model card (Markdown) of a training run: deterministic, nothing measured at run time."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from contracts.terminal_risk import DELAY_DAYS
from scorer.card_history import HISTORY_FEATURE_NAMES
from scorer.catalogue import BY_NAME
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.flag_rate import FLAG_RATE_MARGIN
from simulator.fraud import DEFAULT_SCENARIOS
from simulator.label_regimes import LabelRegime
from training import gbdt, handbook_recipe, mlp
from training.candidates import MODEL_NAMES
from training.card_cells import percent
from training.card_decisions import (
    calibration_by_seed,
    cold_start_held_out_note,
    cold_start_table,
    cost_section,
    fallback_by_seed,
    fallback_rules,
    outcome_table,
    reliability_table,
    thresholds_by_seed,
)
from training.card_evaluation import (
    fold_table,
    fresh_label_note,
    metrics_table,
    published_table,
    regimes_section,
    validation_vs_test,
)
from training.cold_start_check import COLD_CHECK_SEED_OFFSET
from training.fold_data import COLD_START_DAYS, KNOWN_COMPROMISED_FEATURE
from training.onnx_export import INPUT_NAME, IR_VERSION, OPSET, OUTPUT_NAME
from training.protocol import TRAIN_DAYS, assessed_days, validation_days
from training.results import TrainingResult, mean_std
from training.thresholds import FALSE_DECLINE_COST, REVIEW_LEGIT_SHARE


def operators(model: bytes) -> list[str]:
    """The operator types of a serialized model, in the order they first appear."""
    graph = onnx.load_from_string(model).graph
    return list(dict.fromkeys(node.op_type for node in graph.node))


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
fields, its card's history (`scorer/card_history.py`, kept per partition by the service), its
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

{regimes_section(run, by_regime)}

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
{fresh_label_note(run)}
Validation against test, each seed's mean over its folds (the MLP was not chosen, so its test
folds were never scored):

{validation_vs_test(runs)}

For context only, the handbook's published test figures (chapter 5, "Model selection": its own
simulated dataset, its features, 4 test folds, mean ± standard deviation as printed there). They
are not comparable with the rows above: other data.

{published_table()}

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

{fold_table(run)}

## Calibration

The model's log-odds z are mapped to p = sigmoid(a·z + b) (Platt scaling,
`training/calibration.py`), a and b fitted by maximum likelihood on the chosen candidate's
scores of the {folds} validation weeks (days {first_valid}-{last_valid}, {valid_rows:,} rows,
{valid_frauds:,} frauds, all four scenarios; seed {run.seed}: a = {run.platt.a:.4f}, b =
{run.platt.b:.4f}). It is baked into the trees' leaves, so the graph is unchanged and rankings
do not change. Reliability on the {folds} held-out test weeks (seed {run.seed}, all rows), beside
the validation weeks it was fitted on:

{reliability_table(run)}

Every seed:

{calibration_by_seed(runs)}

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

{outcome_table({"validation": run.validation_outcomes, "test": shipped_test}, run)}

**Expected flag rate.** The manifest states the share of all decisions at review or decline
that live traffic should stay within at these thresholds: {percent(low)} to {percent(high)}
(`[thresholds] expected_flag_rate`), the lowest and highest daily share over every row of the
validation weeks (known-compromised cards included, as serving sees them), divided and
multiplied by {FLAG_RATE_MARGIN:g} (`scorer/flag_rate.py`). A replica exports it as
`fraud_model_expected_flag_ratio`, and `FraudFlagRateUnexpected` fires when an hour's live share
leaves it: a model put on traffic it does not fit flags far more, or far less, than it was
chosen to (docs/runbooks.md).

Every seed (each chose its own thresholds on its own validation weeks):

{thresholds_by_seed(runs)}

**Cold start.** A service that starts, and every new card, has no history: the windows fill
over the first days. The validation and test weeks come after
{min(run.schedule.validation)} days of warm-up, so every fold also trains on the stream's first
{COLD_START_DAYS} days (`training_rows` in
`training/fold_data.py`); a model trained on its training week alone flagged 6-8 % of legitimate
transactions on a new stream's first day and 3 % over its first 10 (1 % in steady state). Each
seed's shipped-form model on a stream it never saw (seed + {COLD_CHECK_SEED_OFFSET}, every card
and terminal new on day 0), day by day: legitimate ≥ review / legitimate ≥ decline / fraud
recall at review. {cold_start_held_out_note(runs)}

{cold_start_table(runs)}

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

{fallback_rules(run)}

Outcomes of the shipped rules at the package's thresholds, seed {run.seed}:

{outcome_table({"validation": run.fallback.validation, "test": run.fallback.test}, run)}

Every seed, test weeks:

{fallback_by_seed(runs)}

The compromised-terminal scenario is the hard one, for the model as for the rules and as in the
handbook: its frauds look like ordinary purchases, and only confirmed outcomes at the terminal
reveal it, so the frauds of a compromise before the first of them is confirmed go undetected by
design.
{cost_section(run)}
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
state per card is fixed-size; see `scorer/card_history.py`. A transaction without history (a new
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
