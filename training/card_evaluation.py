"""The model card's evaluation tables: our model against the handbook's recipe, on the same
folds, per seed and per label regime, beside the handbook's published figures.

These answer "how good is the model, and how sure are we": validation against test, fold by
fold, and the one comparison that is fair (the same data, rows and folds for both recipes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simulator.label_regimes import (
    CASE_EXPIRY_MS,
    CHARGEBACK_DELAY_S,
    MAX_CHARGEBACK_DELAY_S,
    REVIEW_WORK_MS,
    REVIEWS_PER_DAY,
    LabelRegime,
)
from training.candidates import HANDBOOK, MODEL_NAMES
from training.card_cells import mean_std_cell, percent
from training.fold_data import FRESH_LABEL_COLUMNS
from training.protocol import Metrics, assessed_days
from training.results import FoldResult, TrainingResult, mean_std, spread
from training.thresholds import REVIEW_LEGIT_SHARE

#: The handbook's published test performance on its own simulated data (chapter 5, "Model
#: selection", the summary table of each model class: test mean +/- standard deviation over its
#: 4 prequential test folds, as printed, each metric at the parameters its validation chose).
PUBLISHED: dict[str, tuple[str, str, str]] = {
    "XGBoost (grid search)": ("0.869 ± 0.01", "0.687 ± 0.01", "0.303 ± 0.01"),
    "random forest": ("0.87 ± 0.02", "0.678 ± 0.01", "0.299 ± 0.01"),
    "logistic regression": ("0.868 ± 0.02", "0.623 ± 0.02", "0.297 ± 0.01"),
}

_RECIPE = "handbook recipe (15 features, XGBoost)"
#: The standard normal's 90th percentile.
_Z_90 = 1.2816


def _name(kind: str) -> str:
    return _RECIPE if kind == HANDBOOK else MODEL_NAMES[kind]


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
        cells = [mean_std_cell(spread(per_seed[field])) for field in Metrics._fields]
        ap = " / ".join(f"{v:.3f}" for v in per_seed["average_precision"])
        lines.append(
            f"| {name} | {' | '.join(cells)} | {ap} | {mean_std_cell(spread(every_fold))} |"
        )
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
                mean_std_cell(spread([mean_std(_test(run, kind), field)[0] for run in runs]))
                for field in Metrics._fields
            ]
            at_review = [run.test_at_review[run.winner if kind == "ours" else kind] for run in runs]
            cells.append(mean_std_cell(spread([at.fraud_recall for at in at_review])))
            cells.append(percent(float(np.mean([at.legit_share for at in at_review]))))
            cells.append(mean_std_cell(spread(gain)) if kind == "ours" else "")
            name = runs[0].model_name if kind == "ours" else _RECIPE
            lines.append(f"| {regime.value} | {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def regimes_section(
    run: TrainingResult, by_regime: dict[LabelRegime, Sequence[TrainingResult]]
) -> str:
    """The card's section on label regimes: how outcomes reach the model, and its table."""
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


def fresh_label_note(run: TrainingResult) -> str:
    """The chosen candidate without the fresh-label columns beside ours and the recipe's; empty
    when the run did not test it."""
    if not run.without_fresh_labels:
        return ""
    columns = ", ".join(f"`{name}`" for name in FRESH_LABEL_COLUMNS)
    rows = []
    for name, folds in (
        (f"{run.model_name} (our recipe)", run.test[run.winner]),
        (f"{run.model_name} without {columns}", run.without_fresh_labels),
        (_RECIPE, run.test[HANDBOOK]),
    ):
        cells = " | ".join(mean_std_cell(mean_std(folds, field)) for field in Metrics._fields)
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


def published_table() -> str:
    """The handbook's published test figures, on its own data."""
    lines = [
        "| handbook, its own data (published) | ROC-AUC | average precision | Card Precision@100 |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {name} | {' | '.join(cells)} |" for name, cells in PUBLISHED.items()]
    return "\n".join(lines)


def validation_vs_test(runs: Sequence[TrainingResult]) -> str:
    """Each seed's mean over its validation folds and over its test folds, model by model."""
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


def fold_table(run: TrainingResult) -> str:
    """Every fold of one run, model by model: handbook-comparable rows and all four scenarios."""
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
