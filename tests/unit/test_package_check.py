"""A model package is checked in a child process, bounded in memory and in time, before a
replica opens its graph (stream/package_check.py): a graph that makes 16 GiB at each run, one
that loops for ever, and one that holds most of the memory cap while it warms up are refused or
checked there, while the model in service keeps scoring, and the replica keeps none of the
memory they took."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
from onnx import helper
from prometheus_client import CollectorRegistry

from plumbing.errors import ConfigurationError, ScoreError
from scorer.features import NUM_FEATURES
from scorer.model_package import load_model_package, promote
from scorer.model_source import DirectorySource
from stream.metrics import ServiceMetrics
from stream.model_reload import ModelReloader, ServingModel, load_serving_model
from stream.package_check import (
    HEADROOM_BYTES,
    MODULE,
    CheckRequest,
    _child_environment,
    address_space_limit,
    check_package,
    manifest_digest,
)
from stream.startup.config import SHIPPED_MODEL_PATH, ScorerSettings
from tests.support.models import (
    holding_model,
    nan_on_burst_model,
    onnx_model,
    package,
    slow_model,
)
from tests.unit.test_model_canary import rows_with_history
from tests.unit.test_model_package_properties import allocating
from tests.unit.test_model_reload import reloads

MIB = 1024 * 1024
#: A check cut short: well above a sound package's (about 1.5 s here), well below the default.
TIMEOUT_S = 8.0


def resident_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


class Serving:
    """The model in service, scoring batches on a thread of its own (as the scoring stage
    does) while a package is checked: how many batches, and the errors of those that failed."""

    def __init__(self, model: ServingModel) -> None:
        self._model = model
        self.batches = 0
        self.errors: list[ScoreError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._score, daemon=True)

    def __enter__(self) -> Serving:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _score(self) -> None:
        rows = np.zeros((64, NUM_FEATURES), np.float32)
        while not self._stop.is_set():
            try:
                scores = self._model.scorer.score(rows)
                assert ((scores >= 0) & (scores <= 1)).all()
            except ScoreError as exc:
                self.errors.append(exc)
            self.batches += 1
            time.sleep(0.002)


def allocating_at_run(nbytes: int, score: str = "sigmoid") -> bytes:
    """Makes `nbytes` from the input at every run (no constant ONNX Runtime could fold away),
    folded into its scores: a probability (`score="sigmoid"`), or NaN for every row."""
    last = (
        helper.make_node("Sigmoid", ["s"], ["score"])
        if score == "sigmoid"
        else helper.make_node("Mul", ["s", "nan"], ["score"])
    )
    return onnx_model(
        [
            helper.make_node("ReduceMax", ["features"], ["m"], axes=[1], keepdims=0),
            helper.make_node("ReduceSum", ["m"], ["total"], keepdims=0),
            helper.make_node("Mul", ["total", "zero"], ["zero_at_run"]),
            helper.make_node("Expand", ["zero_at_run", "shape"], ["c"]),
            helper.make_node("ReduceSum", ["c"], ["cs"], keepdims=0),
            helper.make_node("Add", ["m", "cs"], ["s"]),
            last,
        ],
        {
            "shape": np.array([nbytes // 4], np.int64),
            "zero": np.array(0.0, np.float32),
            "nan": np.array(np.nan, np.float32),
        },
        ["batch"],
    )


def reloader_on(
    link: Path, served: Path, **settings: float
) -> tuple[ModelReloader, ServingModel, CollectorRegistry]:
    link.symlink_to(served)
    config = ScorerSettings(model_path=str(link), model_poll_s=60.0, **settings)  # type: ignore[arg-type]
    source = DirectorySource(link)
    serving = load_serving_model(config, source)
    registry = CollectorRegistry()
    reloader = ModelReloader(config, ServiceMetrics(registry), serving, source=source)
    return reloader, serving, registry


def test_a_graph_that_makes_16_gib_at_each_run_is_refused_and_the_served_model_keeps_scoring(
    tmp_path: Path,
):
    reloader, serving, registry = reloader_on(tmp_path / "champion", SHIPPED_MODEL_PATH)
    promote(
        package(tmp_path / "huge", allocating([65_536, 65_536]), version="huge"),
        tmp_path / "champion",
    )
    before = resident_bytes()
    started = time.perf_counter()
    with Serving(serving) as served:
        assert not reloader.check_now()
    assert time.perf_counter() - started < TIMEOUT_S
    assert reloads(registry, "refused") == 1 and reloader.take() is None
    assert served.batches > 0 and not served.errors
    assert resident_bytes() - before < 64 * MIB


def test_a_graph_that_folds_into_256_mib_when_it_is_opened_is_refused_by_the_address_space(
    tmp_path: Path,
):
    """ONNX Runtime folds a constant `ConstantOfShape` when it opens the graph, outside any
    arena: no cap saw it, and the replica that opened the package grew by 256 MiB. The child's
    address-space limit refuses it."""
    reloader, serving, registry = reloader_on(
        tmp_path / "champion", SHIPPED_MODEL_PATH, model_max_memory_mb=64
    )
    folded = package(tmp_path / "folded", allocating([1_024, 65_536]), version="folded")
    promote(folded, tmp_path / "champion")
    before = resident_bytes()
    with Serving(serving) as served:
        assert not reloader.check_now()
    assert reloads(registry, "refused") == 1 and reloader.take() is None
    assert served.batches > 0 and not served.errors
    assert resident_bytes() - before < 64 * MIB


def test_a_graph_that_loops_for_ever_is_refused_within_the_timeout(tmp_path: Path):
    reloader, serving, registry = reloader_on(
        tmp_path / "champion", SHIPPED_MODEL_PATH, model_check_timeout_s=TIMEOUT_S
    )
    promote(package(tmp_path / "loop", slow_model(2**62), version="loop"), tmp_path / "champion")
    started = time.perf_counter()
    with Serving(serving) as served:
        assert not reloader.check_now()
    assert TIMEOUT_S <= time.perf_counter() - started < TIMEOUT_S + 5.0
    assert reloads(registry, "refused") == 1 and reloader.take() is None
    assert served.batches > 0 and not served.errors
    assert not reloader.check_now(), "not tried again until its files change"


def test_a_candidate_holding_most_of_the_cap_while_it_warms_up_does_not_fail_the_served_model(
    tmp_path: Path,
):
    """Each needs less than the cap, both together more: the served model takes 24 MiB at a
    run, the candidate holds 20 MiB through each of its runs (and copies it as it loops), under
    a cap of 64 MiB. They shared one arena: whichever asked last failed, the candidate's check
    or the served model's runs."""
    served_model = package(tmp_path / "served", allocating_at_run(24 * MIB), version="served")
    reloader, serving, registry = reloader_on(
        tmp_path / "champion", served_model, model_max_memory_mb=64
    )
    candidate = holding_model(20 * MIB, iterations=10, model_version="holding")
    promote(package(tmp_path / "holding", candidate, version="holding"), tmp_path / "champion")
    with Serving(serving) as served:
        assert reloader.check_now()
    assert reloads(registry, "loaded") == 1
    assert served.batches > 0 and not served.errors, served.errors[:1]
    taken = reloader.take()
    assert taken is not None and taken.scorer.model_version == "holding"


def test_a_refused_package_leaves_none_of_its_memory_in_the_replica(tmp_path: Path):
    """It takes 400 MiB at a run, then returns NaN: refused by its sanity score, in the child,
    whose memory went with it. In the replica's own arena it stayed (an arena never shrinks)."""
    reloader, _, registry = reloader_on(tmp_path / "champion", SHIPPED_MODEL_PATH)
    nan_after_400_mib = package(
        tmp_path / "greedy", allocating_at_run(400 * MIB, score="nan"), version="greedy"
    )
    promote(nan_after_400_mib, tmp_path / "champion")
    before = resident_bytes()
    assert not reloader.check_now()
    assert reloads(registry, "refused") == 1
    assert resident_bytes() - before < 64 * MIB


def test_the_address_space_limit_is_the_childs_size_plus_the_cap_and_room_for_weights():
    assert address_space_limit(400 * MIB, 1024, 10 * MIB) == (
        400 * MIB + 1024 * MIB + 30 * MIB + HEADROOM_BYTES
    )


def test_a_sound_package_passes_with_the_digest_of_its_manifest():
    assert check_package(
        SHIPPED_MODEL_PATH, max_batch_size=256, max_memory_mb=1024, timeout_s=60.0
    ) == manifest_digest(load_model_package(SHIPPED_MODEL_PATH).manifest)


def test_a_child_that_cannot_answer_refuses_the_package(tmp_path: Path):
    with pytest.raises(ConfigurationError, match="is not a directory"):
        check_package(tmp_path / "nowhere", max_batch_size=8, max_memory_mb=64, timeout_s=60.0)


def test_the_recent_rows_reach_the_child_exactly(tmp_path: Path):
    """A model that fails only rows the child is sent (a burst of a card's transactions) is
    refused there, naming them; any float, NaN too, travels as it is."""
    bad = package(tmp_path / "burst-nan", nan_on_burst_model(), version="burst-nan")
    rows = rows_with_history()
    check_package(bad, max_batch_size=8, max_memory_mb=64, timeout_s=60.0)  # no rows: passes
    with pytest.raises(ConfigurationError, match=r"of recent transactions: a score of nan"):
        check_package(bad, max_batch_size=8, max_memory_mb=64, timeout_s=60.0, recent=rows)
    odd = np.full((2, NUM_FEATURES), np.nan, np.float32)
    request = CheckRequest("p", 8, 64, recent=odd.tobytes())
    sent = msgspec.json.decode(msgspec.json.encode(request), type=CheckRequest)
    assert np.frombuffer(sent.recent, np.float32).tobytes() == odd.tobytes()


def test_a_check_whose_replica_is_gone_ends_by_itself(tmp_path: Path):
    """Nobody kills it: its CPU time is limited to the timeout too."""
    loop = package(tmp_path / "loop", slow_model(2**62), version="loop")
    request = CheckRequest(str(loop), 8, 64, timeout_s=2.0)
    started = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-m", MODULE],
        input=msgspec.json.encode(request),
        capture_output=True,
        timeout=60,
        env=_child_environment(),
    )
    assert child.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
    assert time.perf_counter() - started < 15.0
