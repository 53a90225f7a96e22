"""The model runtime: an ONNX Runtime session behind the small `Scorer` interface.

It chooses the execution provider (CUDA when it really works, CPU otherwise), checks that the
model was trained on the features this build computes, warms the session up before the first
record, and turns ONNX Runtime's errors into the project's `ScoreError`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from scorer.features import FEATURE_NAMES, NUM_FEATURES
from stream.errors import ConfigurationError, ScoreError

log = logging.getLogger(__name__)

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
#: ONNX Runtime's logger severities: 2 = warning, 4 = fatal only.
_ORT_WARNING, _ORT_FATAL = 2, 4
#: A small MLP gains nothing from intra-op threads; one thread leaves the other core to Kafka.
CPU_THREADS = 1
#: Every exception type ONNX Runtime's bindings raise, plus what numpy input checks raise.
_ORT_ERRORS: tuple[type[BaseException], ...] = (
    *(
        obj
        for obj in vars(ort_state).values()
        if isinstance(obj, type) and issubclass(obj, Exception)
    ),
    RuntimeError,
    ValueError,
)


class Scorer(Protocol):
    """Scores a batch of feature rows; the stream depends on this, not on ONNX Runtime."""

    @property
    def model_version(self) -> str: ...

    def score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Fraud probabilities, one per row of `features` [B, F]."""
        ...


class OnnxScorer:
    """One ONNX Runtime inference session for the fraud model."""

    def __init__(self, model_path: Path, device: Literal["auto", "cuda", "cpu"] = "auto") -> None:
        try:
            model_bytes = model_path.read_bytes()
        except OSError as exc:
            raise ConfigurationError(f"cannot read model {str(model_path)!r}: {exc}") from exc
        self._session = _create_session(model_bytes, device)
        self.provider: str = self._session.get_providers()[0]
        meta = self._session.get_modelmeta().custom_metadata_map
        self._model_version = str(meta.get("model_version", model_path.stem))
        _check_signature(self._session, meta, model_path)
        self._input_name = self._session.get_inputs()[0].name
        log.info(
            "model loaded model_version=%s provider=%s path=%s",
            self._model_version,
            self.provider,
            model_path,
        )

    @property
    def model_version(self) -> str:
        return self._model_version

    def warm_up(self, batch_sizes: tuple[int, ...]) -> float:
        """Run the model once per batch size so the first real batch pays no set-up cost;
        returns the seconds it took."""
        started = time.perf_counter()
        for size in batch_sizes:
            self.score(np.zeros((size, NUM_FEATURES), np.float32))
        return time.perf_counter() - started

    def score(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        try:
            (scores,) = self._session.run(None, {self._input_name: features})
        except _ORT_ERRORS as exc:
            raise ScoreError(f"{type(exc).__name__}: {exc}") from exc
        return np.asarray(scores, np.float32).reshape(-1)


def _create_session(model_bytes: bytes, device: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = CPU_THREADS
    options.inter_op_num_threads = CPU_THREADS
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    want_cuda = device in ("auto", "cuda") and CUDA in ort.get_available_providers()
    providers = [CUDA, CPU] if want_cuda else [CPU]
    # With CUDA asked for but its libraries missing, ONNX Runtime prints an error and quietly
    # builds a CPU session. We judge by the providers the session really got and say it once.
    ort.set_default_logger_severity(_ORT_FATAL if want_cuda else _ORT_WARNING)
    try:
        session = ort.InferenceSession(model_bytes, options, providers=providers)
    except _ORT_ERRORS as exc:
        raise ConfigurationError(f"ONNX Runtime cannot load the model: {exc}") from exc
    finally:
        ort.set_default_logger_severity(_ORT_WARNING)
    got = session.get_providers()[0]
    if device == "cuda" and got != CUDA:
        log.warning(
            "device=cuda asked for, but CUDA is not usable here (no GPU or no CUDA/cuDNN "
            "libraries); scoring on %s instead",
            got,
        )
    return session


def _check_signature(session: ort.InferenceSession, meta: dict[str, str], model_path: Path) -> None:
    inputs = session.get_inputs()
    width = inputs[0].shape[-1] if inputs and inputs[0].shape else None
    trained_on = tuple(meta.get("feature_names", "").split(","))
    if len(inputs) != 1 or width != NUM_FEATURES or trained_on != FEATURE_NAMES:
        raise ConfigurationError(
            f"model {str(model_path)!r} expects features {list(trained_on)} ({width} wide) "
            f"but this build computes {list(FEATURE_NAMES)}; "
            "retrain it with `python -m scorer.train`"
        )
