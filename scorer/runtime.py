"""ONNX Runtime sessions: which execution provider runs the model, and where its nodes landed.

`open_session` turns a requested device into a session. It tries the GPU providers this build
of ONNX Runtime offers (TensorRT only when asked for, then CUDA), judges each by the providers
the created session really got, and falls back to the CPU when no GPU can run (no device,
missing CUDA/cuDNN/TensorRT libraries): one warning when a GPU was asked for, an info line for
`auto`. Every opened session is run once on a zero batch with ONNX Runtime's profiler on, whose
per-node records say which provider ran each node: the `Placement`, from which the caller sees
any node that silently fell back to the CPU in a GPU session.

Memory. On a GPU each session's CUDA arena is capped at `max_memory_bytes`
(FRAUD_MODEL_MAX_MEMORY_MB). On the CPU, a session of the replica has its own arena, uncapped
(ONNX Runtime's default), and a package's check (`stream/package_check.py`, a child process
that opens one package) asks for `cpu_memory_cap`: every tensor of the process then comes from
one arena capped at that, and a graph that declares a tensor past it (a `ConstantOfShape` of
16 GiB) fails with ONNX Runtime's error, which refuses the package. The cap used to apply in
the replica itself, one arena for the served model, the challenger and a package being checked:
a candidate holding most of it during its warm-up made the served model's runs fail, and the
arena never shrinks, so the replica kept that memory after refusing the package. Every package
is now checked in a child first, bounded in memory and time, and only one that passed is opened
here, where its sessions cannot take memory from each other. What no cap bounds here any more:
a graph whose working memory depends on the values of its input (a shape read from a feature),
beyond the rows it was checked with (docs/models.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from plumbing.errors import ConfigurationError

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
GPU_PROVIDERS = frozenset({CUDA, TENSORRT})

Device = Literal["auto", "cuda", "cpu", "tensorrt"]

#: GPU providers to try for each device, best first; the CPU is always the last resort.
_GPU_PREFERENCE: dict[Device, tuple[str, ...]] = {
    "auto": (CUDA,),
    "cuda": (CUDA,),
    "tensorrt": (TENSORRT, CUDA),
    "cpu": (),
}
#: ONNX Runtime's logger severities: 2 = warning, 4 = fatal only.
_ORT_WARNING, _ORT_FATAL = 2, 4
#: Profile records of node executions are named after the node with this suffix.
_KERNEL_TIME_SUFFIX = "_kernel_time"
#: Cut-off for an ONNX Runtime error quoted in the fallback warning (they run to many lines).
_MAX_REASON_CHARS = 400
#: The default cap on the models' working memory (FRAUD_MODEL_MAX_MEMORY_MB's default).
DEFAULT_MAX_MEMORY_BYTES = 1024 * 1024 * 1024
#: The cap of the CPU arena registered for the process (None: none registered yet).
_cpu_arena_bytes: int | None = None
_cpu_arena_lock = threading.Lock()
#: Every exception type ONNX Runtime's bindings raise, plus what numpy input checks raise.
ORT_ERRORS: tuple[type[BaseException], ...] = (
    *(
        obj
        for obj in vars(ort_state).values()
        if isinstance(obj, type) and issubclass(obj, Exception)
    ),
    RuntimeError,
    ValueError,
)


class NodePlacement(NamedTuple):
    """One node of the optimised graph and the execution provider that ran it."""

    node: str
    op_type: str
    provider: str


class Placement(NamedTuple):
    """Where a session runs: its main provider and the provider of every node."""

    provider: str
    nodes: tuple[NodePlacement, ...]

    @property
    def fallback_nodes(self) -> tuple[NodePlacement, ...]:
        """Nodes that ran elsewhere than the session's device (CPU nodes in a GPU session)."""
        home = GPU_PROVIDERS if self.provider in GPU_PROVIDERS else frozenset({self.provider})
        return tuple(node for node in self.nodes if node.provider not in home)

    @property
    def complete(self) -> bool:
        """Whether the profile named every node and all of them ran on the session's device."""
        return bool(self.nodes) and not self.fallback_nodes


class OpenedSession(NamedTuple):
    """A session on the best usable provider, and where it placed the model's nodes."""

    session: ort.InferenceSession
    placement: Placement


def open_session(
    model: bytes,
    device: Device,
    *,
    device_id: int = 0,
    cpu_threads: int = 1,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
    cpu_memory_cap: int | None = None,
) -> OpenedSession:
    """Open `model` on `device` (auto, cuda, tensorrt or cpu), falling back to the CPU when no
    GPU can run it; ConfigurationError when ONNX Runtime cannot load or run the model at all
    (within `max_memory_bytes` of CUDA working memory, and `cpu_memory_cap` of the process's
    CPU arena where one is asked for)."""
    reasons: list[str] = []
    available = ort.get_available_providers()
    for primary in _GPU_PREFERENCE[device]:
        if primary not in available:
            reasons.append(f"this ONNX Runtime build has no {primary}")
            continue
        try:
            session = _create(
                model,
                primary,
                device_id,
                cpu_threads,
                max_memory_bytes,
                cpu_memory_cap,
                profile=True,
            )
        except ORT_ERRORS as exc:
            reasons.append(f"{primary} failed: {_first_line(exc)}")
            continue
        got = session.get_providers()[0]
        if got != primary:
            reasons.append(f"{primary} unusable: no GPU, or its libraries are missing")
        if got in GPU_PROVIDERS:
            if reasons:
                _report_fallback(device, got, reasons)
            return OpenedSession(session, _profile_once(session))
        _end_profiling(session)
    try:
        session = _create(
            model, CPU, device_id, cpu_threads, max_memory_bytes, cpu_memory_cap, profile=True
        )
    except ORT_ERRORS as exc:
        raise ConfigurationError(f"ONNX Runtime cannot load the model: {exc}") from exc
    if reasons:
        _report_fallback(device, CPU, reasons)
    return OpenedSession(session, _profile_once(session))


def node_placement(
    model: bytes, device: Device, *, device_id: int = 0, cpu_threads: int = 1
) -> Placement:
    """Which provider runs each node of `model` when it is opened on `device`."""
    return open_session(model, device, device_id=device_id, cpu_threads=cpu_threads).placement


def cuda_graph_session(
    model: bytes,
    device_id: int,
    cpu_threads: int,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
) -> ort.InferenceSession:
    """A CUDA session that captures and replays CUDA graphs (one per `gpu_graph_id` run option);
    for a model whose every node is known to run on CUDA (see `Placement.complete`)."""
    try:
        session = _create(
            model, CUDA, device_id, cpu_threads, max_memory_bytes, None, cuda_graph=True
        )
    except ORT_ERRORS as exc:
        raise ConfigurationError(f"ONNX Runtime cannot capture CUDA graphs: {exc}") from exc
    if session.get_providers()[0] != CUDA:
        raise ConfigurationError(
            f"CUDA graphs asked for, but the session runs on {session.get_providers()[0]}"
        )
    return session


def _create(
    model: bytes,
    primary: str,
    device_id: int,
    cpu_threads: int,
    max_memory_bytes: int,
    cpu_memory_cap: int | None,
    *,
    profile: bool = False,
    cuda_graph: bool = False,
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if cpu_memory_cap is not None:
        _cap_cpu_memory(options, cpu_memory_cap)
    options.intra_op_num_threads = cpu_threads
    # The model is one chain of nodes: an inter-op pool would have nothing to run in parallel.
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    profile_dir = Path(tempfile.mkdtemp(prefix="fraud-scorer-")) if profile else None
    if profile_dir is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_dir / "run")
    # With a GPU provider whose libraries are missing, ONNX Runtime logs an error and quietly
    # builds a CPU session; we judge by the providers the session got and say it once ourselves.
    ort.set_default_logger_severity(_ORT_FATAL if primary != CPU else _ORT_WARNING)
    try:
        # Without enable_fallback=0 the Python wrapper prints its own fallback to stdout, and
        # after a provider failure while running it swaps the session's providers silently.
        return ort.InferenceSession(
            model,
            options,
            providers=_provider_chain(primary, device_id, cuda_graph, max_memory_bytes),
            enable_fallback=0,
        )
    except ORT_ERRORS:
        if profile_dir is not None:
            shutil.rmtree(profile_dir, ignore_errors=True)
        raise
    finally:
        ort.set_default_logger_severity(_ORT_WARNING)


def _cap_cpu_memory(options: ort.SessionOptions, max_memory_bytes: int) -> None:
    """Make the session take its CPU tensors from the process's arena capped at
    `max_memory_bytes`. For a process that opens untrusted packages under one cap (a package's
    check): ONNX Runtime keeps the first arena registered in a process, so the first cap asked
    for holds for the process, and a later, different one is ignored (logged)."""
    global _cpu_arena_bytes
    with _cpu_arena_lock:
        if _cpu_arena_bytes is None:
            ort.create_and_register_allocator(
                ort.OrtMemoryInfo(
                    "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
                ),
                # max_mem, then ONNX Runtime's defaults: extend strategy, first chunk, dead bytes.
                ort.OrtArenaCfg(max_memory_bytes, -1, -1, -1),
            )
            _cpu_arena_bytes = max_memory_bytes
        elif _cpu_arena_bytes != max_memory_bytes:
            log.warning(
                "a CPU arena capped at %s bytes asked for, but this process's is capped at %s",
                max_memory_bytes,
                _cpu_arena_bytes,
            )
    options.add_session_config_entry("session.use_env_allocators", "1")


def _provider_chain(
    primary: str, device_id: int, cuda_graph: bool, max_memory_bytes: int
) -> list[tuple[str, dict[str, str]]]:
    cuda_options = {"device_id": str(device_id), "gpu_mem_limit": str(max_memory_bytes)}
    if cuda_graph:
        cuda_options["enable_cuda_graph"] = "1"
    chain = {
        TENSORRT: [(TENSORRT, {"device_id": str(device_id)}), (CUDA, cuda_options)],
        CUDA: [(CUDA, cuda_options)],
        CPU: [],
    }[primary]
    return [*chain, (CPU, {})]


def _profile_once(session: ort.InferenceSession) -> Placement:
    """Run `session` once on zeros, end its profiling, and read the node placement from it."""
    feeds = {
        arg.name: np.zeros([dim if isinstance(dim, int) else 1 for dim in arg.shape], np.float32)
        for arg in session.get_inputs()
    }
    try:
        session.run(None, feeds)
    except ORT_ERRORS as exc:
        raise ConfigurationError(f"ONNX Runtime cannot run the model on zeros: {exc}") from exc
    finally:
        events = _end_profiling(session)
    provider = session.get_providers()[0]
    nodes: dict[str, NodePlacement] = {}
    for event in events:
        name = str(event.get("name", ""))
        args = event.get("args", {})
        if event.get("cat") == "Node" and name.endswith(_KERNEL_TIME_SUFFIX):
            node = name.removesuffix(_KERNEL_TIME_SUFFIX)
            nodes.setdefault(
                node, NodePlacement(node, str(args.get("op_name")), str(args.get("provider")))
            )
    return Placement(provider, tuple(nodes.values()))


def _end_profiling(session: ort.InferenceSession) -> list[dict[str, Any]]:
    """Stop profiling `session` and return its records; the profile file and its temporary
    directory are removed."""
    written = session.end_profiling()
    if not written:
        return []
    path = Path(written)
    try:
        events: list[dict[str, Any]] = json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # only ever removes an empty directory
            path.parent.rmdir()
    return events


def _report_fallback(device: Device, got: str, reasons: list[str]) -> None:
    wanted = {"tensorrt": "TensorRT"}.get(device, "CUDA")
    message = "device=%s asked for, but %s is not usable here (%s); scoring on %s instead"
    # `auto` promises CUDA only where it works: falling back there is expected, not a problem.
    level = logging.INFO if device == "auto" else logging.WARNING
    log.log(level, message, device, wanted, "; ".join(reasons), got)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:_MAX_REASON_CHARS] if text else repr(exc)
