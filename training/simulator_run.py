"""`fraud-train simulator` (and `python -m training`, `make model`): train every seed on the
simulator, write the first one's model package with the model card of all of them, and print
the card's main table. Apart from training/train.py, which the card reads, so that neither
imports the other."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from scorer.model_package import write_model_package
from training.card import metrics_table, render_model_card
from training.options import parse_args
from training.train import configure_logging, manifest, package_path, train_models

logger = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m training`: `fraud-train simulator`, its options alone."""
    return train_on_simulator(parse_args(["simulator", *(sys.argv[1:] if argv is None else argv)]))


def train_on_simulator(args: argparse.Namespace) -> int:
    """Train every seed, write the first one's package and the card; print the main table."""
    configure_logging()
    began = time.perf_counter()
    runs = train_models(args.seeds, args.days, args.folds, args.jobs)
    shipped = runs[0]
    out = args.out or package_path(shipped.model_name)
    write_model_package(out, shipped.model, manifest(shipped), render_model_card(runs))
    logger.info(
        "wrote package=%s model_bytes=%d elapsed_s=%.1f",
        out,
        len(shipped.model),
        time.perf_counter() - began,
    )
    print(metrics_table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
