"""GPU benchmark of the scorer: latency (p50/p99) and rows/s per batch size from 1 to 4,096,
CUDA vs CPU, with and without I/O binding and CUDA graphs; GPU memory and utilisation while the
scorer is saturated; cost per million decisions at a given machine price; the exact hardware.

It times `OnnxScorer.score()`, the very call the service makes per micro-batch (feature rows in,
scores out, host↔device copies included), and checks every measured configuration against plain
CPU scores of the same rows (`max_abs_diff`). Without a usable GPU, or with `--device cpu`, it
measures the CPU only and says so.

Self-contained for a GPU machine without network access. It needs this repository and, for
Python 3.12 on x86-64 Linux, these wheels (`pip install --no-index --find-links wheels/ …`):

    onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl  (built for CUDA 13.0)
    numpy-2.5.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
    protobuf-7.36.2-py3-none-any.whl
    flatbuffers-25.12.19-py2.py3-none-any.whl
    packaging-26.4-py3-none-any.whl

and the CUDA 13 and cuDNN 9 libraries: on the host (an nvidia/cuda 13 cudnn-runtime image), or
the wheels of onnxruntime-gpu's `cuda` and `cudnn` extras, loaded with `--preload-dlls`. The
driver must support CUDA 13 (R580 or newer). `nvidia-smi` supplies the hardware description and
the memory and utilisation samples.

    python -m bench.gpu_bench --out h200.json --price-per-hour 3.50
    python -m bench.gpu_bench --device cpu --seconds 0.2 --saturate-s 2   # any machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from bench.gpu_machine import (
    GpuSampler,
    describe_hardware,
    describe_software,
    process_gpu_memory_mib,
)
from bench.model_speed import bench_package
from scorer.features import NUM_FEATURES
from scorer.model import OnnxScorer
from scorer.runtime import CUDA, GPU_PROVIDERS, Device
from stream.startup.config import SHIPPED_MODEL_PATH

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = SHIPPED_MODEL_PATH
#: 1, 2, 4, …, 4,096 rows per call.
DEFAULT_SIZES = tuple(1 << exponent for exponent in range(13))
#: Batch size of the saturation run: the service's default `FRAUD_MAX_BATCH_SIZE`.
DEFAULT_SATURATE_BATCH = 256
#: Calls timed per case however short `--seconds` is, so that a p99 rests on enough calls.
MIN_CALLS = 100
#: Untimed calls before each case: the first calls of a new shape allocate.
WARM_CALLS = 10
#: nvidia-smi sampling period during the saturation run.
_NS_PER_US = 1_000
_SECONDS_PER_HOUR = 3_600
_MILLION = 1_000_000
_SEED = 20_260_101


class Mode(NamedTuple):
    """How the scorer runs the model."""

    name: str
    io_binding: bool
    cuda_graphs: bool


PLAIN = Mode("plain", io_binding=False, cuda_graphs=False)
BOUND = Mode("io-binding", io_binding=True, cuda_graphs=False)
GRAPHS = Mode("io-binding+graphs", io_binding=True, cuda_graphs=True)


class Case(NamedTuple):
    """One measured configuration at one batch size."""

    provider: str
    mode: str
    batch: int
    calls: int
    p50_us: float
    p99_us: float
    rows_per_s: float
    usd_per_million: float | None
    max_abs_diff: float


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cuda", "tensorrt", "cpu"],
        default="auto",
        help="GPU provider to measure beside the CPU; cpu measures the CPU only (default: auto)",
    )
    parser.add_argument("--device-id", type=int, default=0, help="CUDA device ordinal")
    parser.add_argument(
        "--model",
        type=Path,
        default=DEFAULT_MODEL,
        help="model package (or bare ONNX file) to score",
    )
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="batch sizes, comma-separated (default: 1,2,4,...,4096)",
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per case")
    parser.add_argument("--cpu-threads", type=int, default=1, help="intra-op threads on the CPU")
    parser.add_argument(
        "--saturate-s", type=float, default=10.0, help="length of the saturation run, seconds"
    )
    parser.add_argument(
        "--saturate-batch", type=int, default=DEFAULT_SATURATE_BATCH, help="its batch size"
    )
    parser.add_argument(
        "--saturate-threads",
        type=int,
        default=1,
        help="scorers calling concurrently in the saturation run, one session each (a replica "
        "of the service has one scoring thread)",
    )
    parser.add_argument(
        "--price-per-hour",
        type=float,
        default=None,
        help="USD per hour of the measured machine, for the cost per million decisions",
    )
    parser.add_argument(
        "--preload-dlls",
        action="store_true",
        help="load CUDA/cuDNN from the nvidia-* wheels first (onnxruntime.preload_dlls)",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    args.sizes = tuple(int(size) for size in args.sizes.split(","))
    args.model = bench_package(args.model)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.preload_dlls:
        ort.preload_dlls()
    rng = np.random.default_rng(_SEED)
    inputs = {size: rng.normal(size=(size, NUM_FEATURES)).astype(np.float32) for size in args.sizes}
    reference = OnnxScorer(args.model, "cpu", max_batch_size=max(args.sizes))
    expected = {size: reference.score(rows) for size, rows in inputs.items()}
    targets: list[tuple[Device, tuple[Mode, ...]]] = [("cpu", (PLAIN, BOUND))]
    notes: list[str] = []
    gpu_placement: list[dict[str, str]] = []
    if args.device != "cpu":
        placement = scorer_for(args, args.device, PLAIN).placement
        if placement.provider in GPU_PROVIDERS:
            gpu_modes = (PLAIN, BOUND, GRAPHS) if placement.provider == CUDA else (PLAIN, BOUND)
            targets.insert(0, (args.device, gpu_modes))
            gpu_placement = [node._asdict() for node in placement.nodes]
        else:
            notes.append(f"--device {args.device}: no usable GPU here, measured the CPU only")
    cases: list[Case] = []
    for device, modes in targets:
        for mode in modes:
            scorer = scorer_for(args, device, mode)
            if scorer.cuda_graphs != mode.cuda_graphs:
                notes.append(f"{mode.name} skipped on {scorer.provider}: CUDA graphs unavailable")
                continue
            scorer.warm_up()
            for size in args.sizes:
                cases.append(measure(scorer, mode, inputs[size], expected[size], args))
    saturation = saturate(args, targets[0][0])
    report = {
        "hardware": describe_hardware(args.device_id),
        "software": describe_software(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "notes": notes,
        "gpu_node_placement": gpu_placement,
        "cases": [case._asdict() for case in cases],
        "saturation": saturation,
    }
    print_report(report, cases)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwritten: {args.out}")
    return 0


def scorer_for(args: argparse.Namespace, device: Device, mode: Mode | None) -> OnnxScorer:
    """A scorer in `mode`, or as the service configures it for the device when None."""
    return OnnxScorer(
        args.model,
        device,
        device_id=args.device_id,
        cpu_threads=args.cpu_threads,
        max_batch_size=max(args.sizes),
        io_binding=None if mode is None else mode.io_binding,
        cuda_graphs=True if mode is None else mode.cuda_graphs,
    )


def measure(
    scorer: OnnxScorer,
    mode: Mode,
    rows: npt.NDArray[np.float32],
    expected: npt.NDArray[np.float32],
    args: argparse.Namespace,
) -> Case:
    """Time `scorer.score(rows)` for `args.seconds` (at least MIN_CALLS calls)."""
    max_abs_diff = float(np.max(np.abs(scorer.score(rows) - expected)))
    for _ in range(WARM_CALLS):
        scorer.score(rows)
    latencies_ns: list[int] = []
    deadline = time.perf_counter() + args.seconds
    while len(latencies_ns) < MIN_CALLS or time.perf_counter() < deadline:
        started = time.perf_counter_ns()
        scorer.score(rows)
        latencies_ns.append(time.perf_counter_ns() - started)
    rows_per_s = len(rows) * len(latencies_ns) / (sum(latencies_ns) / 1e9)
    return Case(
        provider=scorer.provider,
        mode=mode.name,
        batch=len(rows),
        calls=len(latencies_ns),
        p50_us=statistics.median(latencies_ns) / _NS_PER_US,
        p99_us=percentile(latencies_ns, 0.99) / _NS_PER_US,
        rows_per_s=rows_per_s,
        usd_per_million=cost_per_million(args.price_per_hour, rows_per_s),
        max_abs_diff=max_abs_diff,
    )


def saturate(args: argparse.Namespace, device: Device) -> dict[str, Any]:
    """Score `--saturate-batch` rows in a closed loop on `--saturate-threads` threads, each with
    its own scorer configured as the service configures it, while nvidia-smi samples the GPU."""
    scorers = [scorer_for(args, device, None) for _ in range(args.saturate_threads)]
    rng = np.random.default_rng(_SEED)
    rows = rng.normal(size=(args.saturate_batch, NUM_FEATURES)).astype(np.float32)
    scored = [0] * len(scorers)
    warm_up_lock = threading.Lock()
    all_warm = threading.Barrier(len(scorers) + 1)
    stop = threading.Event()

    def loop(index: int) -> None:
        # Graphs are captured per thread, and one thread's copies during another's capture
        # would invalidate it: warm up on this thread, one thread at a time.
        with warm_up_lock:
            scorers[index].warm_up()
        all_warm.wait()
        while not stop.is_set():
            scorers[index].score(rows)
            scored[index] += len(rows)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(scorers))]
    for thread in threads:
        thread.start()
    all_warm.wait()
    sampler = GpuSampler(args.device_id) if scorers[0].provider in GPU_PROVIDERS else None
    started = time.perf_counter()
    time.sleep(args.saturate_s / 2)
    process_memory_mib = process_gpu_memory_mib() if sampler is not None else None
    time.sleep(args.saturate_s / 2)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed_s = time.perf_counter() - started
    samples = sampler.stop() if sampler is not None else []
    rows_per_s = sum(scored) / elapsed_s
    return {
        "provider": scorers[0].provider,
        "io_binding": scorers[0].io_binding,
        "cuda_graphs": scorers[0].cuda_graphs,
        "batch": args.saturate_batch,
        "threads": args.saturate_threads,
        "seconds": elapsed_s,
        "rows_per_s": rows_per_s,
        "usd_per_million": cost_per_million(args.price_per_hour, rows_per_s),
        "gpu_utilisation_pct_mean": mean_or_none([s[0] for s in samples]),
        "gpu_utilisation_pct_max": max((s[0] for s in samples), default=None),
        "gpu_memory_used_mib_max": max((s[1] for s in samples), default=None),
        "process_gpu_memory_mib": process_memory_mib,
        "samples": len(samples),
    }


def percentile(values: list[int], fraction: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))])


def mean_or_none(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def cost_per_million(price_per_hour: float | None, rows_per_s: float) -> float | None:
    """USD per million decisions when the machine scores `rows_per_s` for every paid second."""
    if price_per_hour is None:
        return None
    return price_per_hour / _SECONDS_PER_HOUR / rows_per_s * _MILLION


def print_report(report: dict[str, Any], cases: list[Case]) -> None:
    hardware, software = report["hardware"], report["software"]
    print(f"GPUs: {'; '.join(hardware['gpus']) or 'none (no nvidia-smi)'}")
    print(
        f"measured GPU: {hardware['gpu_measured']}, driver CUDA {hardware['driver_cuda_version']}"
    )
    print(
        f"CPU: {hardware['cpu_model']}, {hardware['cpus_usable']} usable of {hardware['cpu_count']}"
    )
    print(
        f"onnxruntime {software['onnxruntime']} (CUDA {software['onnxruntime_cuda_build']}), "
        f"numpy {software['numpy']}, Python {software['python']}"
    )
    for note in report["notes"]:
        print(f"note: {note}")
    print()
    header = (
        f"{'provider':<26} {'mode':<18} {'batch':>6} {'p50 us':>9} {'p99 us':>9} "
        f"{'rows/s':>12} {'$/1M':>8} {'max|diff|':>9}"
    )
    print(header)
    print("-" * len(header))
    for case in cases:
        cost = "-" if case.usd_per_million is None else f"{case.usd_per_million:.3g}"
        print(
            f"{case.provider:<26} {case.mode:<18} {case.batch:>6} {case.p50_us:>9.1f} "
            f"{case.p99_us:>9.1f} {case.rows_per_s:>12,.0f} {cost:>8} {case.max_abs_diff:>9.1e}"
        )
    saturation = report["saturation"]
    cost = saturation["usd_per_million"]
    print(
        f"\nsaturated: {saturation['provider']} (io_binding={saturation['io_binding']}, "
        f"cuda_graphs={saturation['cuda_graphs']}), batch "
        f"{saturation['batch']}, {saturation['threads']} thread(s), {saturation['seconds']:.1f}s: "
        f"{saturation['rows_per_s']:,.0f} rows/s"
        + ("" if cost is None else f", ${cost:.3g} per million decisions")
    )
    if saturation["samples"]:
        print(
            f"GPU utilisation mean {saturation['gpu_utilisation_pct_mean']:.0f}% "
            f"max {saturation['gpu_utilisation_pct_max']:.0f}%, memory used max "
            f"{saturation['gpu_memory_used_mib_max']:.0f} MiB (this process: "
            f"{saturation['process_gpu_memory_mib']} MiB)"
        )


if __name__ == "__main__":
    sys.exit(main())
