"""A model source that cannot be read, or a package that cannot serve, stops the start of a
replica with one line (exit 2: fix the setting or the package; exit 1: the source may come back,
the orchestrator restarts it) before any Kafka client exists. Later, while it serves, the same
faults leave the model in service (tests/unit/test_model_reload.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scorer.model_package import ONNX_FILE
from stream.startup.cli import EXIT_FAILURE, EXIT_USAGE, main
from tests.support.models import (
    nan_on_history_model,
    nan_on_real_rows_model,
    package,
    slow_model,
)
from tests.unit.test_model_reload import package_copy


@pytest.fixture(autouse=True)
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def start(model_path: str, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    """`fraud-scorer run` with this model source, against no broker (port 9: discard); its
    exit status and what it logged past its start line."""
    status = main(
        ["run", "--model-path", model_path, "--bootstrap-servers", "127.0.0.1:9",
         "--metrics-port", "0", *flags]
    )  # fmt: skip
    lines = capsys.readouterr().err.splitlines()
    return status, "\n".join(line for line in lines if " INFO " not in line)


def test_a_package_directory_that_does_not_exist_stops_the_start(tmp_path: Path, capsys):
    status, err = start(str(tmp_path / "nowhere"), capsys)
    assert status == EXIT_USAGE
    assert "is not a model package directory" in err and len(err.splitlines()) == 1


def test_a_directory_without_a_readable_package_stops_the_start(tmp_path: Path, capsys):
    (tmp_path / "empty").mkdir()
    status, err = start(str(tmp_path / "empty"), capsys)
    assert status == EXIT_FAILURE
    assert "holds no readable model.toml and model.onnx" in err
    assert "stopping" in err and len(err.splitlines()) == 1


def test_a_package_whose_graph_does_not_match_its_manifest_stops_the_start(tmp_path: Path, capsys):
    spoiled = package_copy(tmp_path / "spoiled", "spoiled")
    (spoiled / ONNX_FILE).write_bytes((spoiled / ONNX_FILE).read_bytes() + b"\0")
    status, err = start(str(spoiled), capsys)
    assert status == EXIT_USAGE
    assert "sha256" in err and len(err.splitlines()) == 1


def test_a_package_that_returns_nan_for_real_transactions_stops_the_start(tmp_path: Path, capsys):
    status, err = start(str(package(tmp_path / "nan", nan_on_real_rows_model())), capsys)
    assert status == EXIT_USAGE
    assert "typical transactions" in err and "not a probability" in err


def test_a_package_that_returns_nan_for_any_card_with_history_stops_the_start(
    tmp_path: Path, capsys
):
    """It scores zeros and a card's first transaction: the typical rows' cards with history
    refuse it, before any traffic (a restart after a rollback meets it so)."""
    status, err = start(str(package(tmp_path / "nan", nan_on_history_model())), capsys)
    assert status == EXIT_USAGE
    assert "typical transactions" in err and "not a probability" in err


def test_a_package_whose_graph_loops_for_ever_stops_the_start_within_the_check_timeout(
    tmp_path: Path, capsys
):
    started = time.perf_counter()
    status, err = start(
        str(package(tmp_path / "loop", slow_model(2**62))), capsys, "--model-check-timeout-s", "5"
    )
    assert status == EXIT_USAGE and time.perf_counter() - started < 5 + 10
    assert "was not checked within 5 s" in err and len(err.splitlines()) == 1


def test_an_mlflow_registry_that_cannot_be_reached_stops_the_start(
    monkeypatch: pytest.MonkeyPatch, capsys
):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://alice:s3cret@127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    status, err = start("models:/fraud@champion", capsys)
    assert status == EXIT_FAILURE
    assert "stopping: MLflow model models:/fraud@champion could not be read from" in err
    assert "http://***@127.0.0.1:9" in err and "s3cret" not in err
