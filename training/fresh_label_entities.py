"""Do confirmed frauds known so far help per card and per merchant, as they do per terminal?

    python -m training.fresh_label_entities [--seeds 7,8,9] [--days 122] [--folds 4]

The shipped features count, per terminal, the frauds confirmed by the time of the decision
(`terminal_fresh_frauds_*`, `scorer/terminal_risk.py`). This study adds the same count per card
and per merchant (a merchant's terminals together), computed point in time from each label's
`reported_at` exactly as the terminal's, and trains the shipped candidate (`training/gbdt.py`)
with and without them on the validation folds only (the test weeks are not read). It prints,
per seed and then mean ± standard deviation over seeds: average precision, ROC AUC, and each
scenario's recall at the review threshold that flags 1 % of legitimate traffic.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from contracts.terminal_risk import FRESH_WINDOWS_DAYS, MS_PER_DAY
from simulator.fraud import DEFAULT_SCENARIOS
from simulator.replay import Stream, simulate
from simulator.transactions import DEFAULT_CARDS
from training import gbdt
from training.fold_data import stream_fold, training_rows
from training.options import add_stream_options
from training.protocol import fold_schedule, protocol_metrics
from training.thresholds import REVIEW_LEGIT_SHARE

_Floats = npt.NDArray[np.float32]
#: The entities whose fresh-label counts are tried, by the label field that names them.
ENTITIES = ("card", "merchant")
VARIANTS = ("shipped", "+card", "+merchant", "+card+merchant")


def fresh_fraud_counts(
    entity: Sequence[str],
    event_time: npt.NDArray[np.int64],
    labels: Sequence[dict[str, object]],
    label_entity: Sequence[str],
    window_days: int,
) -> _Floats:
    """Per transaction, the frauds of its entity reported before it (reported_at < its time)
    whose event time is within `window_days` before it, as log(1 + count)."""
    names = {name: i for i, name in enumerate(sorted(set(entity)))}
    ids = np.array([names[name] for name in entity], np.int64)
    span = int(event_time.max()) + window_days * MS_PER_DAY + 1
    keys = ids * span + event_time
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    counts = np.zeros(len(keys) + 1, np.int64)
    for label, name in zip(labels, label_entity, strict=True):
        if not label["fraud"] or name not in names:
            continue
        base = names[name] * span
        seen_from = int(str(label["reported_at"]))
        until = int(str(label["event_time"])) + window_days * MS_PER_DAY
        first = np.searchsorted(sorted_keys, base + seen_from, side="right")
        last = np.searchsorted(sorted_keys, base + until, side="right")
        if first < last:
            counts[first] += 1
            counts[last] -= 1
    out = np.empty(len(keys), np.float32)
    out[order] = np.log1p(np.cumsum(counts[:-1]))
    return out


def entity_columns(stream: Stream, merchant_of_terminal: dict[str, str]) -> dict[str, _Floats]:
    """The fresh-fraud columns of each entity, by name (`<entity>_fresh_frauds_<w>d`)."""
    columns = stream.columns
    label_entities = {
        "card": [str(label["card_id"]) for label in stream.labels],
        "merchant": [
            merchant_of_terminal.get(str(label.get("terminal_id")), "") for label in stream.labels
        ],
    }
    row_entities = {"card": list(columns.card_id), "merchant": list(columns.merchant_id)}
    return {
        f"{entity}_fresh_frauds_{w}d": fresh_fraud_counts(
            row_entities[entity], columns.event_time, stream.labels, label_entities[entity], w
        )
        for entity in ENTITIES
        for w in FRESH_WINDOWS_DAYS
    }


def _merchant_of_terminal(stream: Stream) -> dict[str, str]:
    columns = stream.columns
    return {
        terminal: merchant
        for terminal, merchant in zip(columns.terminal_id, columns.merchant_id, strict=True)
        if terminal
    }


def _variant(stream: Stream, extra: dict[str, _Floats], name: str) -> _Floats:
    chosen = [
        column
        for entity in ENTITIES
        if f"+{entity}" in name
        for column in extra
        if column.startswith(entity)
    ]
    if not chosen:
        return stream.features
    return np.column_stack([stream.features, *(extra[column] for column in chosen)])


def study_seed(seed: int, days: int, folds: int, cards: int) -> dict[str, dict[str, float]]:
    """Each variant's validation figures on one seed: the mean over its validation folds."""
    stream = simulate(seed, days, cards)
    extra = entity_columns(stream, _merchant_of_terminal(stream))
    schedule = fold_schedule(days, folds)
    results: dict[str, dict[str, list[float]]] = {v: {} for v in VARIANTS}
    for start in schedule.validation:
        fold = stream_fold(stream, start)
        train = training_rows(stream, fold.train)
        assessed = fold.test
        for name in VARIANTS:
            features = _variant(stream, extra, name)
            model = gbdt.fit(features[train], stream.is_fraud[train], seed)
            scores = gbdt.raw_scores(model, features[assessed])
            metrics = protocol_metrics(
                stream.day[assessed], stream.card[assessed], stream.is_fraud[assessed], scores
            )
            legit = ~stream.is_fraud[assessed]
            review = np.quantile(scores[legit], 1.0 - REVIEW_LEGIT_SHARE)
            figures = {
                "average_precision": metrics.average_precision,
                "roc_auc": metrics.roc_auc,
            }
            scenario = stream.scenario[assessed]
            for kind in DEFAULT_SCENARIOS:
                if kind != "legit" and (scenario == kind).any():
                    figures[f"recall_{kind}"] = float((scores[scenario == kind] > review).mean())
            for key, value in figures.items():
                results[name].setdefault(key, []).append(value)
        logging.info("seed %d: validation fold from day %d done", seed, start)
    return {name: {k: float(np.mean(v)) for k, v in r.items()} for name, r in results.items()}


def _table(by_seed: dict[int, dict[str, dict[str, float]]]) -> str:
    first = next(iter(by_seed.values()))
    keys = list(first["shipped"])
    lines = [
        "| variant | " + " | ".join(keys) + " |",
        "| --- |" + " ---: |" * len(keys),
    ]
    for name in VARIANTS:
        cells = []
        for key in keys:
            values = [run[name][key] for run in by_seed.values()]
            cells.append(f"{np.mean(values):.4f} ± {np.std(values, ddof=1):.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.fresh_label_entities",
        description="Validation-fold study: fresh-label counts per card and per merchant beside "
        "the shipped per-terminal ones (prints a Markdown table).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_stream_options(parser)
    parser.add_argument(
        "--cards",
        type=int,
        default=DEFAULT_CARDS,
        help="simulated customers (the handbook's; fewer for a quick run)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    by_seed = {seed: study_seed(seed, args.days, args.folds, args.cards) for seed in args.seeds}
    for seed, run in by_seed.items():
        print(
            f"seed {seed}: "
            + "; ".join(f"{name} AP {r['average_precision']:.4f}" for name, r in run.items())
        )
    seeds = ", ".join(map(str, args.seeds))
    print(f"\nValidation folds, mean over folds, then mean ± std over seeds {seeds}:\n")
    print(_table(by_seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
