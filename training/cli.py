"""`fraud-train`: train the fraud model, on the simulator (the shipped model, `make model`) or
from the topics the service wrote (`--from-topics`, training/from_topics.py)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from contracts.environment import check_environment
from contracts.errors import ConfigurationError


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        for warning in check_environment("fraud-train"):
            print(f"fraud-train: {warning}", file=sys.stderr)
    except ConfigurationError as exc:
        print(f"fraud-train: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        if "--from-topics" in args:
            from training.from_topics import main as from_topics

            return from_topics(args)
        from training.train import main as on_the_simulator

        return on_the_simulator(args)
    except ModuleNotFoundError as exc:
        print(
            f"fraud-train: {exc.name} is missing: pip install 'fraud-scorer[train]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
