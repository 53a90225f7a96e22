"""`fraud-train simulator` (and `python -m training`, `make model`): train every seed on the
simulator under each label regime, write the first seed's model package of the first regime
with the model card of all of them, and print the card's main table and its regime table.
Apart from training/train.py, which trains and writes nothing."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from scorer.model_package import write_model_package
from simulator.label_regimes import LabelRegime
from training.card import render_model_card
from training.card_evaluation import metrics_table, regime_table
from training.options import parse_args
from training.results import TrainingResult
from training.shipped_package import manifest, package_path
from training.train import configure_logging, train_models

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m training`: `fraud-train simulator`, its options alone."""
    return train_on_simulator(parse_args(["simulator", *(sys.argv[1:] if argv is None else argv)]))


def train_on_simulator(args: argparse.Namespace) -> int:
    """Train every seed under every regime, write the first one's package and the card; print
    the main table and the regime table."""
    configure_logging()
    began = time.perf_counter()
    by_regime: dict[LabelRegime, Sequence[TrainingResult]] = {}
    for regime in args.regimes:
        by_regime[regime] = train_models(
            args.seeds,
            args.days,
            args.folds,
            args.jobs,
            regime,
            args.audit_share,
            without_fresh_labels=not by_regime,  # the shipped regime's first seed only
        )
        logger.info("regime=%s elapsed_s=%.1f", regime.value, time.perf_counter() - began)
    runs = by_regime[args.regimes[0]]
    shipped = runs[0]
    out = args.out or package_path(shipped.model_name)
    card = render_model_card(runs, by_regime)
    write_model_package(out, shipped.model, manifest(shipped), card)
    logger.info(
        "wrote package=%s model_bytes=%d elapsed_s=%.1f",
        out,
        len(shipped.model),
        time.perf_counter() - began,
    )
    print(metrics_table(runs))
    print(regime_table(by_regime))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
