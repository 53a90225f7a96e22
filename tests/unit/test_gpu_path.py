"""The GPU path: provider choice and fallback, bucket padding, the I/O binding code path on the
CPU provider, the node-placement check, warm-up of every bucket.

Provider choice is checked against what ONNX Runtime itself can open on this machine
(`usable`): CI has no GPU, so there a request for CUDA or TensorRT must fall back to the CPU
with one warning; on a GPU machine the same request must get the GPU.
"""

from __future__ import annotations

import ctypes
import logging
import tempfile
import threading
from functools import cache
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest

from plumbing.errors import ConfigurationError, ScoreError
from scorer.binding import bucket_sizes
from scorer.features import NUM_FEATURES
from scorer.model import OnnxScorer
from scorer.model_package import load_model_package
from scorer.pinned import pinned_zeros
from scorer.runtime import (
    CPU,
    CUDA,
    TENSORRT,
    Device,
    NodePlacement,
    Placement,
    node_placement,
    open_session,
)
from stream.startup.config import SHIPPED_MODEL_PATH, ScorerSettings
from tests.support.models import POISON, package, poison_model

SHIPPED = load_model_package(SHIPPED_MODEL_PATH)
#: ONNX Runtime's logger severity that silences its error about a provider it cannot load.
_ORT_FATAL = 4


@cache
def usable(provider: str) -> bool:
    """Whether ONNX Runtime, asked directly, opens the shipped model on `provider` here: the
    build has it, and its device and libraries are present (else the session gets the CPU)."""
    if provider not in ort.get_available_providers():
        return False
    options = ort.SessionOptions()
    options.log_severity_level = _ORT_FATAL
    session = ort.InferenceSession(SHIPPED.onnx, options, providers=[provider, CPU])
    return bool(session.get_providers()[0] == provider)


def expected_provider(device: Device) -> str:
    """The provider `device` must get on this machine: the first usable GPU provider it asks
    for (TensorRT only when asked for, then CUDA), else the CPU."""
    wanted = {"tensorrt": (TENSORRT, CUDA), "cuda": (CUDA,), "auto": (CUDA,)}.get(device, ())
    return next((provider for provider in wanted if usable(provider)), CPU)


def features(rows: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).normal(size=(rows, NUM_FEATURES)).astype(np.float32)


def record_model_calls(scorer: OnnxScorer, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The batch sizes `scorer` runs the model on from now on, in order."""
    sizes: list[int] = []
    score = scorer._score

    def recording(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        sizes.append(len(rows))
        return score(rows)

    monkeypatch.setattr(scorer, "_score", recording)
    return sizes


@pytest.mark.parametrize("device", ["cuda", "tensorrt"])
def test_a_gpu_request_gets_the_gpu_or_falls_back_with_one_warning(
    caplog: pytest.LogCaptureFixture, device: Device
) -> None:
    with caplog.at_level(logging.INFO):
        scorer = OnnxScorer(SHIPPED, device)
    expected = expected_provider(device)
    assert scorer.provider == expected
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if expected == (TENSORRT if device == "tensorrt" else CUDA):
        assert not warnings, "the GPU asked for runs: nothing to warn about"
    else:  # no GPU here (CI), or TensorRT's libraries missing next to a usable CUDA
        assert len(warnings) == 1, warnings
        assert f"device={device} asked for" in warnings[0]
        assert f"scoring on {expected} instead" in warnings[0]
    assert scorer.score(features(2)).shape == (2,)


def test_auto_picks_cuda_where_usable_else_cpu_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        scorer = OnnxScorer(SHIPPED, "auto")
    assert scorer.provider == expected_provider("auto")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    said_unusable = any("CUDA is not usable here" in r.getMessage() for r in caplog.records)
    assert said_unusable == (scorer.provider == CPU), "an info line says why, only on the CPU"


def test_cpu_device_asks_for_no_gpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="scorer.runtime"):
        scorer = OnnxScorer(SHIPPED, "cpu")
    assert scorer.provider == CPU
    assert not caplog.records
    assert not scorer.io_binding and not scorer.cuda_graphs, "the CPU runs the exact batch"


def test_node_placement_names_every_node_and_its_provider() -> None:
    placement = node_placement(SHIPPED.onnx, "cpu")
    assert placement.provider == CPU
    assert placement.nodes, "the profile must name the model's nodes"
    assert {node.provider for node in placement.nodes} == {CPU}
    assert {"GatherElements", "Greater", "Cast"} <= {node.op_type for node in placement.nodes}
    assert placement.complete and not placement.fallback_nodes


def test_a_cpu_node_in_a_gpu_session_is_a_fallback() -> None:
    gemm = NodePlacement("layer0", "Gemm", CUDA)
    reshape = NodePlacement("Reshape_6", "Reshape", CPU)
    mixed = Placement(CUDA, (gemm, reshape))
    assert mixed.fallback_nodes == (reshape,) and not mixed.complete
    assert Placement(CUDA, (gemm,)).complete
    assert not Placement(CUDA, ()).complete, "a profile without nodes proves nothing"


def test_placement_profiles_leave_no_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    devices: tuple[Device, ...] = ("cpu", "cuda", "tensorrt")
    for device in devices:
        OnnxScorer(SHIPPED, device)
    assert not list(tmp_path.iterdir())


def test_cpu_sessions_get_the_configured_threads() -> None:
    opened = open_session(SHIPPED.onnx, "cpu", cpu_threads=2)
    assert opened.session.get_session_options().intra_op_num_threads == 2


@pytest.mark.parametrize(
    ("max_batch_size", "expected"),
    [
        (1, (1,)),
        (2, (1, 2)),
        (100, (1, 2, 4, 8, 16, 32, 64, 100)),
        (256, (1, 2, 4, 8, 16, 32, 64, 128, 256)),
        (4096, (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)),
    ],
)
def test_buckets_are_powers_of_two_up_to_the_batch_cap(
    max_batch_size: int, expected: tuple[int, ...]
) -> None:
    assert bucket_sizes(max_batch_size) == expected


def test_padded_scores_are_identical_to_unpadded_scores_for_every_size() -> None:
    bound = OnnxScorer(SHIPPED, "cpu", io_binding=True, max_batch_size=64)
    plain = OnnxScorer(SHIPPED, "cpu", io_binding=False)
    assert bound.io_binding and not plain.io_binding
    rows = features(200)
    # 0 … 200 covers every bucket, sizes just above and below each, and chunks of the largest.
    for size in range(201):
        assert np.array_equal(bound.score(rows[:size]), plain.score(rows[:size])), size


def test_rows_of_an_earlier_batch_never_reach_the_model(tmp_path: Path) -> None:
    model = load_model_package(package(tmp_path / "poison", poison_model()))
    scorer = OnnxScorer(model, "cpu", io_binding=True, max_batch_size=8)
    poisoned = np.full((8, NUM_FEATURES), POISON, np.float32)
    with pytest.raises(ScoreError):
        scorer.score(poisoned)
    # Three rows run in the bucket of 4, whose padding row held poison a moment ago.
    assert scorer.score(np.zeros((3, NUM_FEATURES), np.float32)).tolist() == [1.0, 1.0, 1.0]


class FakeClock:
    """Stands in for the `time` module of scorer.model: a perf_counter that tests move."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def perf_counter(self) -> float:
        return self.now_s


SECONDS_PER_CALL = 0.25


@pytest.mark.parametrize("io_binding", [False, True], ids=["plain", "bound"])
def test_warm_up_scores_every_bucket(io_binding: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    scorer = OnnxScorer(SHIPPED, "cpu", io_binding=io_binding, max_batch_size=100)
    sizes = record_model_calls(scorer, monkeypatch)
    # A clock that moves only while the model runs: warm-up reports exactly the time it scored.
    clock = FakeClock()
    monkeypatch.setattr("scorer.model.time", clock)
    score = scorer._score

    def slow(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        clock.now_s += SECONDS_PER_CALL
        return score(rows)

    monkeypatch.setattr(scorer, "_score", slow)
    assert scorer.warm_up() == pytest.approx(SECONDS_PER_CALL * len(sizes))
    assert sorted(set(sizes)) == [1, 2, 4, 8, 16, 32, 64, 100] == list(scorer.buckets)
    assert len(sizes) == len(scorer.buckets), "one run per bucket without CUDA graphs"


def test_a_thread_that_did_not_warm_up_captures_its_graphs_on_its_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scorer = OnnxScorer(SHIPPED, "cpu", io_binding=True, max_batch_size=4)
    scorer.cuda_graphs = True  # as on a CUDA session; the CPU provider has no graphs to capture
    scorer.warm_up()
    sizes = record_model_calls(scorer, monkeypatch)
    scorer.score(features(3))
    assert sizes == [3], "the thread that warmed up has its graphs"
    other = threading.Thread(target=scorer.score, args=(features(3),))
    other.start()
    other.join()
    assert sizes == [3, 1, 1, 1, 2, 2, 2, 4, 4, 4, 3], "three runs per bucket, then the batch"


def _cuda_runtime_loads() -> bool:
    try:
        ctypes.CDLL(f"libcudart.so.{str(ort.cuda_version).split('.')[0]}")
    except OSError:
        return False
    return True


def test_without_a_cuda_runtime_pinned_memory_is_reported_unavailable() -> None:
    if _cuda_runtime_loads():
        pytest.skip("this machine has the CUDA runtime: the next test covers it")
    assert pinned_zeros((4, NUM_FEATURES), device_id=0) is None


def test_pinned_memory_is_zeroed_and_writable() -> None:
    if not _cuda_runtime_loads():
        pytest.skip("no CUDA runtime on this machine: pinned memory cannot be allocated")
    array = pinned_zeros((4, NUM_FEATURES), device_id=0)
    assert array is not None, "the runtime loads, so the allocation must succeed"
    assert array.shape == (4, NUM_FEATURES) and not array.any()
    array[:] = 1.0
    assert array.all()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FRAUD_DEVICE": "tpu"}, "device must be one of auto, cpu, cuda, tensorrt"),
        ({"FRAUD_DEVICE_ID": "-1"}, "device_id must be an integer >= 0"),
        ({"FRAUD_CPU_THREADS": "-2"}, "cpu_threads must be an integer in 0..1024"),
    ],
)
def test_bad_gpu_settings_name_the_setting_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ScorerSettings.from_sources({}, env)


def test_gpu_settings_come_from_the_environment() -> None:
    env = {"FRAUD_DEVICE": "tensorrt", "FRAUD_DEVICE_ID": "1", "FRAUD_CPU_THREADS": "0"}
    config = ScorerSettings.from_sources({}, env)
    assert (config.device, config.device_id, config.cpu_threads) == ("tensorrt", 1, 0)
