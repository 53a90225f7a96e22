"""Hot reload (stream/model_reload.py): a new package at FRAUD_MODEL_PATH is loaded, checked and
handed over once; a package that fails a check is refused and the model in use keeps serving."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import numpy as np
import pytest
from onnx import helper
from prometheus_client import CollectorRegistry

from model_tools.cli import main as fraud_model
from plumbing.errors import ConfigurationError, ModelSourceUnavailableError
from scorer.features import FEATURE_NAMES
from scorer.model_package import (
    MANIFEST_FILE,
    ONNX_FILE,
    load_model_package,
    manifest_toml,
    promote,
    write_model_package,
)
from scorer.model_source import DirectorySource, ModelSource
from stream.metrics import ServiceMetrics
from stream.model_reload import ModelReloader, load_serving_model
from stream.package_check import sanity_check
from stream.startup.config import SHIPPED_MODEL_PATH, ScorerSettings
from tests.support.models import onnx_model, package


def package_copy(directory: Path, version: str) -> Path:
    """The shipped package under another version name."""
    shipped = load_model_package(SHIPPED_MODEL_PATH)
    manifest = msgspec.structs.replace(
        shipped.manifest, model=msgspec.structs.replace(shipped.manifest.model, version=version)
    )
    write_model_package(directory, shipped.onnx, manifest)
    return directory


@pytest.fixture
def source(tmp_path: Path) -> Path:
    link = tmp_path / "champion"
    link.symlink_to(package_copy(tmp_path / "v1", "v1"))
    return link


def reloader_on(
    source: Path, model_source: ModelSource | None = None
) -> tuple[ModelReloader, CollectorRegistry]:
    config = ScorerSettings(model_path=str(source), model_poll_s=60.0)
    registry = CollectorRegistry()
    watched = model_source or DirectorySource(source)
    serving = load_serving_model(config, watched)
    reloader = ModelReloader(config, ServiceMetrics(registry), serving, source=watched)
    return reloader, registry


def reloads(registry: CollectorRegistry, result: str) -> float | None:
    return registry.get_sample_value(
        "fraud_model_reloads_total", {"role": "served", "result": result}
    )


def test_a_repointed_link_hands_over_the_new_model_once(source: Path, tmp_path: Path):
    reloader, registry = reloader_on(source)
    assert not reloader.check_now() and reloader.take() is None

    promote(package_copy(tmp_path / "v2", "v2"), source)
    assert reloader.check_now()
    taken = reloader.take()
    assert taken is not None and taken.scorer.model_version == "v2"
    assert taken.explainer is not None and taken.policy.thresholds.review > 0
    assert reloader.take() is None and not reloader.check_now()
    assert reloads(registry, "loaded") == 1 and reloads(registry, "refused") == 0


def test_a_package_rewritten_in_place_is_reloaded(source: Path):
    reloader, _ = reloader_on(source)
    package_copy(source.resolve(), "v1-fixed")
    assert reloader.check_now()
    taken = reloader.take()
    assert taken is not None and taken.scorer.model_version == "v1-fixed"


def test_a_broken_package_is_refused_once_and_the_old_model_keeps_serving(
    source: Path, tmp_path: Path
):
    reloader, registry = reloader_on(source)
    broken = package_copy(tmp_path / "broken", "broken")
    promote(broken, source)
    (broken / ONNX_FILE).write_bytes(b"not a graph")  # changed after it was promoted
    assert not reloader.check_now() and reloader.take() is None
    assert not reloader.check_now()  # the same files are not tried again
    assert reloads(registry, "refused") == 1

    promote(package_copy(tmp_path / "v3", "v3"), source)
    assert reloader.check_now()
    taken = reloader.take()
    assert taken is not None and taken.scorer.model_version == "v3"


def test_a_package_whose_thresholds_cross_the_configured_ones_is_refused(
    source: Path, tmp_path: Path
):
    # A configured review just under the shipped decline, and a package declining below it.
    review = 0.9 * load_model_package(source).manifest.thresholds.decline
    config = ScorerSettings(model_path=str(source), review_threshold=review)
    registry = CollectorRegistry()
    watched = DirectorySource(source)
    serving = load_serving_model(config, watched)
    reloader = ModelReloader(config, ServiceMetrics(registry), serving, source=watched)
    low = package_copy(tmp_path / "low", "low")
    manifest = load_model_package(low).manifest
    thresholds = msgspec.structs.replace(manifest.thresholds, review=review / 3, decline=review / 2)
    (low / MANIFEST_FILE).write_text(
        manifest_toml(msgspec.structs.replace(manifest, thresholds=thresholds))
    )
    promote(low, source)
    assert not reloader.check_now()
    assert reloads(registry, "refused") == 1


def test_a_package_that_scores_outside_zero_one_fails_its_sanity_score(tmp_path: Path):
    model = load_serving_model(ScorerSettings(), DirectorySource(package_copy(tmp_path / "p", "p")))
    sanity_check(model.scorer)  # the shipped graph scores its reference row as a probability

    class Doubling:
        """The same model, its scores doubled past 1."""

        package = model.scorer.package

        def score(self, features):
            return model.scorer.score(features) * 2 + 1

    with pytest.raises(ConfigurationError, match="not a probability"):
        sanity_check(Doubling())  # type: ignore[arg-type]


def test_a_source_that_is_gone_is_unavailable_and_read_again_at_each_poll(
    source: Path, tmp_path: Path
):
    """A package directory gone (a volume unmounted, a link to nothing) or half copied cannot
    be read: the model in service stays, each poll counts it, and the package is loaded once
    it is back whole."""
    reloader, registry = reloader_on(source)
    target = source.resolve()
    shutil.rmtree(target)
    assert not reloader.check_now() and not reloader.check_now()
    assert reloads(registry, "unavailable") == 2 and reloads(registry, "refused") == 0
    target.mkdir()
    (target / MANIFEST_FILE).write_text("format = 1\n")  # copied so far: no model.onnx yet
    assert not reloader.check_now() and reloads(registry, "unavailable") == 3
    package_copy(target, "back")
    assert reloader.check_now()
    taken = reloader.take()
    assert taken is not None and taken.scorer.model_version == "back"
    assert reloads(registry, "refused") == 0


def test_promote_refuses_a_source_that_is_not_a_link_and_a_package_that_does_not_load(
    tmp_path: Path, capsys
):
    package = package_copy(tmp_path / "v1", "v1")
    assert fraud_model(["promote", str(package), "--source", str(package)]) == 2
    assert "is not a symbolic link" in capsys.readouterr().err
    (package / ONNX_FILE).write_bytes(b"changed")
    assert fraud_model(["promote", str(package), "--source", str(tmp_path / "link")]) == 2
    assert "sha256" in capsys.readouterr().err and not (tmp_path / "link").exists()


def test_promote_makes_and_repoints_the_link(tmp_path: Path, capsys):
    link = tmp_path / "champion"
    v1, v2 = package_copy(tmp_path / "v1", "v1"), package_copy(tmp_path / "v2", "v2")
    assert fraud_model(["promote", str(v1), "--source", str(link)]) == 0
    assert "promoted v1" in capsys.readouterr().out and link.resolve() == v1.resolve()
    assert fraud_model(["promote", str(v2), "--source", str(link)]) == 0
    assert f"was {v1.resolve()}" in capsys.readouterr().out
    assert load_model_package(link).version == "v2"


def test_a_package_that_fails_its_warm_up_is_refused_once(source: Path, tmp_path: Path):
    reloader, registry = reloader_on(source)
    # Reshapes the batch to one row: opens and scores a single row, fails on two or more.
    one_row_only = onnx_model(
        [
            helper.make_node("Reshape", ["features", "one_row"], ["row"]),
            helper.make_node("ReduceMax", ["row"], ["peak"], axes=[1], keepdims=0),
            helper.make_node("Sigmoid", ["peak"], ["score"]),
        ],
        {"one_row": np.array([1, len(FEATURE_NAMES)], np.int64)},
        ["batch"],
    )
    promote(package(tmp_path / "one-row", one_row_only, version="one-row"), source)
    assert not reloader.check_now() and reloader.take() is None
    assert not reloader.check_now()
    assert reloads(registry, "refused") == 1 and reloads(registry, "loaded") == 0


class Flaky(DirectorySource):
    """A directory source that cannot be asked while `down` (as an MLflow server down)."""

    down = False

    def identity(self) -> tuple[str, tuple[int, int], tuple[int, int]]:
        if self.down:
            raise ModelSourceUnavailableError("the registry is down")
        return super().identity()


def test_a_source_that_cannot_be_asked_is_counted_and_asked_again(source: Path, tmp_path: Path):
    flaky = Flaky(source)
    reloader, registry = reloader_on(source, flaky)
    promote(package_copy(tmp_path / "v2", "v2"), source)
    flaky.down = True
    assert not reloader.check_now() and not reloader.check_now()
    assert reloads(registry, "unavailable") == 2 and reloads(registry, "refused") == 0
    flaky.down = False
    assert reloader.check_now()
    taken = reloader.take()
    assert taken is not None and taken.scorer.model_version == "v2"
