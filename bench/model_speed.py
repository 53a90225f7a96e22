"""CPU scoring speed of ONNX models side by side: rows/s per batch size, one intra-op thread.

Times `OnnxScorer(model, "cpu", cpu_threads=1).score(x)` after `warm_up()`, the call the service
makes per micro-batch on the CPU. The models take turns within each round, so a busy machine
slows all of them alike; each figure is the best round (the least disturbed one) of calls
timed back to back. The speed-up column is against the first model. Scoring a tree ensemble costs
the same whatever the rows hold (every tree walks all its levels), so the rows are random.

    git show 851e014:scorer/models/fraud-gbdt.onnx > /tmp/gemm.onnx
    python -m bench.model_speed /tmp/gemm.onnx scorer/models/fraud-gbdt
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime

from plumbing.errors import ConfigurationError
from scorer.features import NUM_FEATURES
from scorer.model import OnnxScorer
from scorer.model_package import ModelPackage, load_model_package, plain_manifest
from stream.startup.options import SHIPPED_MODEL_PATH

DEFAULT_SIZES = (1, 16, 64, 256, 1024)
#: Rows scored per model per round at every batch size (at least MIN_CALLS calls).
ROWS_PER_ROUND = 20_000
MIN_CALLS = 5
_SEED = 20_260_101


def bench_package(path: Path) -> ModelPackage:
    """The package at `path`, or a bare ONNX graph wrapped in memory, reading the features its
    metadata names (every catalogue feature when it names none): benchmarks compare graphs,
    older ones included, without packaging each."""
    if path.is_dir():
        return load_model_package(path)
    try:
        onnx = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read model {str(path)!r}: {exc}") from exc
    session = onnxruntime.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    named = session.get_modelmeta().custom_metadata_map.get("feature_names")
    manifest = plain_manifest(path.stem, path.stem, *([named.split(",")] if named else []))
    return ModelPackage(path, manifest, onnx)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.model_speed", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "models",
        nargs="*",
        type=Path,
        default=[SHIPPED_MODEL_PATH],
        help="model packages or bare ONNX files (reading every feature)",
    )
    parser.add_argument(
        "--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="batch sizes, comma-separated"
    )
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the best one counts")
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",")]
    if args.rounds < 1 or min(args.sizes) < 1:
        parser.error("--rounds and every batch size must be >= 1")
    return args


def measure(scorers: Sequence[OnnxScorer], sizes: Sequence[int], rounds: int) -> list[list[float]]:
    """Best seconds per call, [model][size]."""
    rng = np.random.default_rng(_SEED)
    best = [[float("inf")] * len(sizes) for _ in scorers]
    for _ in range(rounds):
        for s, size in enumerate(sizes):
            rows = rng.normal(size=(size, NUM_FEATURES)).astype(np.float32)
            calls = max(MIN_CALLS, ROWS_PER_ROUND // size)
            for m, scorer in enumerate(scorers):
                scorer.score(rows)
                started = time.perf_counter()
                for _ in range(calls):
                    scorer.score(rows)
                best[m][s] = min(best[m][s], (time.perf_counter() - started) / calls)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scorers = [OnnxScorer(bench_package(path), "cpu", cpu_threads=1) for path in args.models]
    for scorer in scorers:
        scorer.warm_up()
    best = measure(scorers, args.sizes, args.rounds)
    print(f"{'model':40} {'batch':>6} {'µs/call':>10} {'rows/s':>12} {'speed-up':>8}")
    for path, seconds in zip(args.models, best, strict=True):
        for size, per_call, first in zip(args.sizes, seconds, best[0], strict=True):
            print(
                f"{str(path)[-40:]:40} {size:6d} {per_call * 1e6:10.1f} "
                f"{size / per_call:12,.0f} {first / per_call:8.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
