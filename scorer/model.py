"""The model runtime: the fraud model behind the small `Scorer` interface.

`OnnxScorer` opens a model package's graph (scorer/model_package.py) on the configured device
(scorer/runtime.py: provider choice, fallback, node placement), checks the graph against the
package's manifest, feeds it the manifest's columns of the feature matrix, warms every batch
shape up before the first record, and turns ONNX Runtime's errors into the project's
`ScoreError`. On a GPU it scores through pre-bound buffers of a few bucket sizes, with
CUDA graphs where every node runs on CUDA (scorer/binding.py); on the CPU one plain run of the
exact batch is faster, as padding only adds work there (docs/gpu.md).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from plumbing.errors import ConfigurationError, ScoreError
from scorer.binding import BucketRunner, bucket_sizes
from scorer.features import NUM_FEATURES
from scorer.model_package import ModelPackage
from scorer.runtime import (
    CUDA,
    DEFAULT_MAX_MEMORY_BYTES,
    GPU_PROVIDERS,
    ORT_ERRORS,
    Device,
    cuda_graph_session,
    open_session,
)

log = logging.getLogger(__name__)

#: The service's default batch cap (`FRAUD_MAX_BATCH_SIZE`).
DEFAULT_MAX_BATCH_SIZE = 256
#: Warm-up runs per bucket with CUDA graphs on: ONNX Runtime captures a graph only after
#: regular runs have sized its memory arena (two in current releases, one in older ones).
_GRAPH_CAPTURE_RUNS = 3


class Scorer(Protocol):
    """Scores a batch of feature rows; the stream depends on this, not on ONNX Runtime."""

    @property
    def model_version(self) -> str: ...

    def warm_up(self) -> float:
        """Run every batch shape once on the calling thread; return the seconds it took."""
        ...

    def score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Fraud scores, one per row of the feature matrix `features` [B, NUM_FEATURES]."""
        ...


class OnnxScorer:
    """The fraud model in one ONNX Runtime session on the best usable device.

    One caller at a time: the bound buffers are shared between calls. ONNX Runtime keeps CUDA
    graphs per thread, so the first call from a thread that has not warmed up captures its own.
    """

    def __init__(
        self,
        package: ModelPackage,
        device: Device = "auto",
        *,
        device_id: int = 0,
        cpu_threads: int = 1,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        io_binding: bool | None = None,
        cuda_graphs: bool = True,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
        cpu_memory_cap: int | None = None,
    ) -> None:
        """`io_binding=None` binds on a GPU and runs plainly on the CPU; `cuda_graphs` applies
        to a bound CUDA session whose every node runs on CUDA; `max_memory_bytes`: the most
        its working tensors may take on a GPU; `cpu_memory_cap`: on the CPU, the process's
        capped arena (a package's check; None: the session's own; scorer/runtime.py)."""
        model = package.onnx
        opened = open_session(
            model,
            device,
            device_id=device_id,
            cpu_threads=cpu_threads,
            max_memory_bytes=max_memory_bytes,
            cpu_memory_cap=cpu_memory_cap,
        )
        self.placement = opened.placement
        self.provider: str = self.placement.provider
        self.package = package
        self._model_version = package.version
        _check_signature(opened.session, package)
        index = package.feature_index
        #: The package's columns of the feature matrix; None when it reads all, in order.
        self._columns = None if np.array_equal(index, np.arange(NUM_FEATURES)) else index
        on_gpu = self.provider in GPU_PROVIDERS
        if on_gpu and not self.placement.complete:
            log.error(
                "not every node runs on the GPU, CUDA graphs are off: %s",
                self.placement.fallback_nodes or "the profile names no nodes",
            )
        self.buckets = bucket_sizes(max_batch_size)
        self.io_binding = on_gpu if io_binding is None else io_binding
        self.cuda_graphs = (
            cuda_graphs and self.io_binding and self.provider == CUDA and self.placement.complete
        )
        self._session: ort.InferenceSession = (
            cuda_graph_session(model, device_id, cpu_threads, max_memory_bytes)
            if self.cuda_graphs
            else opened.session
        )
        self._input_name = self._session.get_inputs()[0].name
        self._runner: BucketRunner | None = None
        if self.io_binding:
            try:
                self._runner = BucketRunner(
                    self._session, self.buckets, device_id=device_id, cuda_graphs=self.cuda_graphs
                )
            except ORT_ERRORS as exc:
                raise ConfigurationError(f"cannot allocate the model's buffers: {exc}") from exc
        self._graph_threads: set[int] = set()
        log.info(
            "model loaded model_version=%s provider=%s nodes_on_device=%s/%s io_binding=%s "
            "cuda_graphs=%s buckets=%s cpu_threads=%s path=%s",
            self._model_version,
            self.provider,
            len(self.placement.nodes) - len(self.placement.fallback_nodes),
            len(self.placement.nodes),
            self.io_binding,
            self.cuda_graphs,
            ",".join(map(str, self.buckets)),
            cpu_threads,
            package.path,
        )

    @property
    def model_version(self) -> str:
        return self._model_version

    def warm_up(self) -> float:
        """Score every bucket size (with CUDA graphs, often enough to capture each bucket's graph
        on this thread) so that the first real batches pay no set-up cost; returns the seconds
        it took."""
        started = time.perf_counter()
        runs = _GRAPH_CAPTURE_RUNS if self.cuda_graphs else 1
        for size in self.buckets:
            for _ in range(runs):
                self._score(np.zeros((size, NUM_FEATURES), np.float32))
        self._graph_threads.add(threading.get_ident())
        return time.perf_counter() - started

    def score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if self.cuda_graphs and threading.get_ident() not in self._graph_threads:
            log.info(
                "captured CUDA graphs for thread %s in %.3fs",
                threading.current_thread().name,
                self.warm_up(),
            )
        return self._score(features)

    def _score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if self._columns is not None:
            features = np.ascontiguousarray(features[:, self._columns])
        try:
            if self._runner is not None:
                return self._runner.run(features)
            (scores,) = self._session.run(None, {self._input_name: features})
        except ORT_ERRORS as exc:
            raise ScoreError(f"{type(exc).__name__}: {exc}") from exc
        return np.asarray(scores, np.float32).reshape(-1)


def _check_signature(session: ort.InferenceSession, package: ModelPackage) -> None:
    where = str(package.path)
    features = package.manifest.features
    inputs = session.get_inputs()
    width = inputs[0].shape[-1] if inputs and inputs[0].shape else None
    if len(inputs) != 1 or width != len(features) or inputs[0].type != "tensor(float)":
        raise ConfigurationError(
            f"model package {where!r}: the graph reads {[(i.type, i.shape) for i in inputs]} but "
            f"the manifest names {len(features)} features: one float32 input [batch, "
            f"{len(features)}] is needed; fix the manifest's features or re-export the model"
        )
    outputs = session.get_outputs()
    if len(outputs) != 1 or list(outputs[0].shape[1:]) not in ([], [1]):
        raise ConfigurationError(
            f"model package {where!r} must have one output of one score per row "
            f"([batch] or [batch, 1]), got shapes {[output.shape for output in outputs]}"
        )
