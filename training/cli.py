"""`fraud-train`: train the fraud model, on the simulator (`fraud-train simulator`, the shipped
model, `make model`) or from the topics the service wrote (`fraud-train from-topics`,
training/from_topics.py). The command line: training/options.py."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from plumbing.environment import check_environment
from plumbing.errors import ConfigurationError
from training.options import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        for warning in check_environment("fraud-train"):
            print(f"fraud-train: {warning}", file=sys.stderr)
    except ConfigurationError as exc:
        print(f"fraud-train: configuration error: {exc}", file=sys.stderr)
        return 2
    parsed = parse_args(args)
    try:
        if parsed.command == "from-topics":
            from training.from_topics import train_from_topics

            return train_from_topics(parsed)
        from training.simulator_run import train_on_simulator

        return train_on_simulator(parsed)
    except ModuleNotFoundError as exc:
        print(
            f"fraud-train: {exc.name} is missing: pip install 'fraud-scorer[train]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
