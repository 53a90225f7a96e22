"""Scaling studies of the service, beside `make bench`:

- `processes`: pipeline throughput of one service process, and of two in the one group (what
  two pods or `docker compose up --scale scorer=2` run: each its own instance id and metrics
  port) on this host (rounds interleaved, arm order rotated, medians and spreads), each with the
  peak of its processes' summed resident memory and their CPU seconds: the across-cores curve's
  first step;
- `models`: pipeline throughput and p99 event→decision at 5,000 tx/s with the shipped model and
  with synthetic models costing about 10x and 100x its CPU time per row at batch 256 (MLPs of
  the width that gets there, calibrated on this machine: the shipped model is trees, whose cost
  is lookups, not multiply-adds), each with `--scoring inline` and `--scoring thread`, to find
  where batching and the scoring thread pay, and where a GPU would.

    python -m bench.scaling processes [--records N] [--rounds 3]
    python -m bench.scaling models [--records N]

Results go to bench/results/scaling-<study>.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench.contenders import Run, contender, latency
from bench.harness import Broker, free_port, process_cpu_s, produce_backlog
from bench.model_speed import measure
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.model import OnnxScorer
from scorer.model_package import ONNX_FILE, load_model_package, plain_manifest, write_model_package
from stream.startup.config import SHIPPED_MODEL_PATH
from training.onnx_export import INPUT_NAME, OUTPUT_NAME, finish_model

RESULTS = Path(__file__).resolve().parent / "results"
MODEL_FACTORS = (10, 100)
#: Size of the MLP that measures this machine's CPU time per multiply-add.
PROBE_MULTIPLY_ADDS = 200_000
#: Batch size of the calibration: the service's cap.
CALIBRATION_BATCH = 256
#: Each model is run with batches scored on the consuming thread and on the scoring thread.
SCORING_MODES = ("inline", "thread")
#: The arms of the processes study: how many copies of the service run side by side.
PROCESS_ARMS: dict[str, int] = {"1_process": 1, "2_processes": 2}
#: How often the service's processes are sampled for memory and CPU.
SAMPLE_INTERVAL_S = 0.25
KIB_PER_MB = 1024


def multiply_adds_per_row(model: onnx.ModelProto) -> int:
    """Multiply-adds per input row of the MatMul/Gemm nodes whose weights are initializers
    (a [.., K, N] weight costs its size per row)."""
    weights = {init.name: tuple(init.dims) for init in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            for name in node.input[1:2]:
                if name in weights:
                    total += int(np.prod(weights[name]))
    return total


def _cpu_s_per_row(path: Path) -> float:
    """Best CPU seconds per row of one ONNX Runtime call at CALIBRATION_BATCH, one thread."""
    scorer = OnnxScorer(load_model_package(path), "cpu", cpu_threads=1)
    scorer.warm_up()
    return measure([scorer], [CALIBRATION_BATCH], rounds=5)[0][0] / CALIBRATION_BATCH


def synthetic_model(path: Path, multiply_adds: int) -> Path:
    """An MLP features → W → W → 1 with about `multiply_adds` per row (W from the quadratic)."""
    width = max(
        8, int((-(NUM_FEATURES + 1) + ((NUM_FEATURES + 1) ** 2 + 4 * multiply_adds) ** 0.5) / 2)
    )
    rng = np.random.default_rng(5)
    shapes = {"w1": (NUM_FEATURES, width), "w2": (width, width), "w3": (width, 1)}
    init = {n: rng.normal(0, 0.05, s).astype(np.float32) for n, s in shapes.items()}
    init["flat"] = np.array([-1], np.int64)
    nodes = [
        helper.make_node("MatMul", [INPUT_NAME, "w1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node("MatMul", ["r2", "w3"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["p"]),
        helper.make_node("Reshape", ["p", "flat"], [OUTPUT_NAME]),
    ]
    graph = helper.make_graph(
        nodes,
        f"synthetic-{multiply_adds}",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", NUM_FEATURES])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        [numpy_helper.from_array(value, name) for name, value in init.items()],
    )
    version = f"synthetic-{multiply_adds}-macs"
    metadata = {"feature_names": ",".join(FEATURE_NAMES), "model_version": version}
    model = finish_model(helper.make_model(graph), metadata)
    write_model_package(path, model, plain_manifest(version, version))
    return path


def _run(args: argparse.Namespace, scratch: Path, flags: Sequence[str] = ()) -> Run:
    return Run(
        bootstrap=args.bootstrap_servers,
        records=args.records,
        partitions=args.partitions,
        rounds=args.rounds,
        warmup_s=args.warmup,
        window_s=args.window,
        latency_duration_s=args.latency_duration,
        price_per_hour=0.0,
        kafka_options=(),
        service_flags=tuple(flags),
        logs=RESULTS / "logs",
        scratch=scratch,
    )


class ServiceWatch(threading.Thread):
    """Samples the service's processes until stopped: the interpreters running `-m stream` in
    `group` (one, or several copies) and every process below them (each one's model-package
    check child, `stream/package_check.py`, while it starts).
    Figures: the peak of the summed resident memory of them all and of the `-m stream` ones
    alone, and the CPU seconds of them all (each process's as last sampled)."""

    def __init__(self, group: str) -> None:
        super().__init__(daemon=True)
        self._group = group
        self._done = threading.Event()
        self._peak_kib = {"all": 0, "service": 0}
        self._cpu_s: dict[int, float] = {}
        self._services: set[int] = set()

    def run(self) -> None:
        while not self._done.wait(SAMPLE_INTERVAL_S):
            services, tree = self._pids()
            self._services |= services
            kib = {"all": 0, "service": 0}
            for pid in tree:
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    self._cpu_s[pid] = process_cpu_s(pid)
                except OSError:  # gone since listed
                    continue
                rss = next((ln.split()[1] for ln in status.splitlines() if ln[:6] == "VmRSS:"), 0)
                kib["all"] += int(rss)
                kib["service"] += int(rss) if pid in services else 0
            self._peak_kib = {k: max(v, kib[k]) for k, v in self._peak_kib.items()}

    def _pids(self) -> tuple[set[int], set[int]]:
        """The `-m stream` processes of the group, and those with all their descendants."""
        services, parents = set(), {}
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
                stat = (proc / "stat").read_text()
            except OSError:  # gone since listed
                continue
            parents[int(proc.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
            if argv[:3] == [sys.executable, "-m", "stream"] and self._group in argv:
                services.add(int(proc.name))
        tree = set(services)
        while grown := {pid for pid, parent in parents.items() if parent in tree} - tree:
            tree |= grown
        return services, tree

    def stop(self) -> dict[str, float | int]:
        """End the sampling; the figures of the processes seen."""
        self._done.set()
        self.join()
        return {
            "processes": len(self._services),
            "peak_rss_mb": round(self._peak_kib["all"] / KIB_PER_MB, 1),
            "service_peak_rss_mb": round(self._peak_kib["service"] / KIB_PER_MB, 1),
            "cpu_s": round(sum(self._cpu_s.values()), 2),
        }


def _copies(count: int, role: str) -> list[str]:
    """A `contender` wrapper starting the service `count` times side by side, each with its
    own instance id and metrics port (the last value of a repeated flag wins); the shell ignores
    the SIGINT that stops the run and waits for the services' drain."""
    port = free_port()
    starts = " & ".join(
        f'"$@" --instance-id {role}-{i} --metrics-port {port + i}' for i in range(count)
    )
    return ["sh", "-c", f"trap '' INT; {starts} & wait", "sh"]


def _summary(values: Sequence[float]) -> dict[str, object]:
    return {
        "median": statistics.median(values) if values else None,
        "spread": [min(values), max(values)] if values else None,
    }


def _processes(args: argparse.Namespace, broker: Broker, backlog: str, scratch: Path) -> Any:
    rounds: dict[str, list[dict[str, Any]]] = {arm: [] for arm in PROCESS_ARMS}
    arms = list(PROCESS_ARMS)
    for index in range(args.rounds):
        for arm in arms[index % len(arms) :] + arms[: index % len(arms)]:
            copies = PROCESS_ARMS[arm]
            role = f"{arm}-{index}"
            watch = ServiceWatch(broker.group(role))
            watch.start()
            wrapper = _copies(copies, role) if copies > 1 else ()
            m = contender(_run(args, scratch), broker, "pipeline", backlog, role, wrapper)
            measured = {"tps": m.records_per_s, "outputs": m.outputs, **watch.stop()}
            rounds[arm].append(measured)
            print(f"round {index + 1}: {arm}: {measured} {m.error or ''}", file=sys.stderr)
    table: dict[str, Any] = {}
    for arm, runs in rounds.items():
        table[arm] = {
            key: _summary([r[key] for r in runs if r[key] is not None])
            for key in ("tps", "peak_rss_mb", "service_peak_rss_mb", "cpu_s")
        }
        table[arm]["rounds"] = runs
    one, two = (table[arm]["tps"]["median"] for arm in PROCESS_ARMS)
    table["speedup"] = round(two / one, 2) if one and two else None
    return table


def _models(args: argparse.Namespace, broker: Broker, backlog: str, scratch: Path) -> Any:
    # The shipped model is trees (lookups, no MatMul), so "10x its cost" is calibrated in CPU
    # time per row at batch 256: a probe MLP gives this machine's time per multiply-add.
    shipped_s = _cpu_s_per_row(SHIPPED_MODEL_PATH)
    probe = synthetic_model(scratch / "probe", PROBE_MULTIPLY_ADDS)
    s_per_multiply_add = _cpu_s_per_row(probe) / multiply_adds_per_row(
        onnx.load(str(probe / ONNX_FILE))
    )
    models = {"shipped": SHIPPED_MODEL_PATH}
    for factor in MODEL_FACTORS:
        macs = int(factor * shipped_s / s_per_multiply_add)
        models[f"{factor}x"] = synthetic_model(scratch / f"x{factor}", macs)
    table: dict[str, Any] = {}
    for name, path in models.items():
        table[name] = {
            "multiply_adds_per_row": multiply_adds_per_row(onnx.load(str(path / ONNX_FILE))),
            "cpu_us_per_row_at_256": round(_cpu_s_per_row(path) * 1e6, 2),
        }
        for scoring in SCORING_MODES:
            run = _run(args, scratch, ("--model-path", str(path), "--scoring", scoring))
            role = f"model-{name}-{scoring}"
            m = contender(run, broker, "pipeline", backlog, role)
            broker.delete_topics(keep=(backlog,))  # the latency run shares the broker with less
            report = RESULTS / f"latency-report-{name}-{scoring}"
            lat = latency(run, broker, report, role=f"latency-{name}-{scoring}")
            table[name][scoring] = {
                "pipeline_tps": m.records_per_s,
                "p99_ms_at_5000": lat.get("p99_ms"),
                "lost": lat.get("lost"),
            }
            print(f"{name}, scoring {scoring}: {table[name][scoring]}", file=sys.stderr)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "study",
        choices=["processes", "models"],
        help="processes: one service process against two in one group; models: the shipped "
        "model against 10x and 100x heavier ones",
    )
    parser.add_argument(
        "--bootstrap-servers",
        default="127.0.0.1:9092",
        help="a running broker (default: %(default)s; `make kafka-up` starts one)",
    )
    parser.add_argument(
        "--records", type=int, default=2_000_000, help="backlog size (default: %(default)s)"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="partitions of the backlog topic (default: %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds (processes study; default: %(default)s)"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=3.0,
        help="seconds after a run's first output before its window opens (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=10.0,
        help="seconds of steady state measured per run (default: %(default)s)",
    )
    parser.add_argument(
        "--latency-duration",
        type=float,
        default=20.0,
        help="seconds of each open-loop 5,000 tx/s latency run (models study; default: "
        "%(default)s)",
    )
    args = parser.parse_args(argv)
    (RESULTS / "logs").mkdir(parents=True, exist_ok=True)
    broker = Broker(args.bootstrap_servers)
    with tempfile.TemporaryDirectory(prefix="scaling-") as scratch:
        try:
            broker.check()
            backlog = broker.topic("scaling-backlog", args.partitions)
            produce_backlog(args.bootstrap_servers, backlog, args.records)
            study = _processes if args.study == "processes" else _models
            table = study(args, broker, backlog, Path(scratch))
        finally:
            broker.delete_topics()
    (RESULTS / f"scaling-{args.study}.json").write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
