"""Model packages (scorer/model_package.py): what is checked before a graph is ever opened."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec
import pytest

from plumbing.errors import ConfigurationError
from scorer.decisions import Thresholds
from scorer.features import NUM_FEATURES
from scorer.model_package import (
    MANIFEST_FILE,
    ONNX_FILE,
    load_model_package,
    manifest_toml,
    plain_manifest,
    write_model_package,
)
from stream.startup.config import SHIPPED_MODEL_PATH

GRAPH = b"graph bytes: not checked until the graph is opened"


def written(tmp_path: Path, **changes: object) -> Path:
    manifest = msgspec.structs.replace(plain_manifest("m", "m-1"), **changes)
    write_model_package(tmp_path / "p", GRAPH, manifest)
    return tmp_path / "p"


def test_the_manifest_written_reads_back_the_same(tmp_path: Path) -> None:
    package = load_model_package(written(tmp_path, reference=[0.5] * NUM_FEATURES))
    text = (tmp_path / "p" / MANIFEST_FILE).read_text(encoding="utf-8")
    assert tomllib.loads(text)["model"] == {"name": "m", "version": "m-1"}
    assert manifest_toml(package.manifest) == text
    assert package.version == "m-1" and package.thresholds == Thresholds(0.5, 0.8)


def test_the_shipped_package_loads_and_its_card_is_there() -> None:
    package = load_model_package(SHIPPED_MODEL_PATH)
    assert package.manifest.model.name == "fraud-gbdt"
    assert package.reference is not None
    assert (SHIPPED_MODEL_PATH / "MODEL_CARD.md").is_file()


def test_a_changed_graph_is_refused_by_its_hash(tmp_path: Path) -> None:
    path = written(tmp_path)
    (path / ONNX_FILE).write_bytes(GRAPH + b"!")
    with pytest.raises(ConfigurationError, match="changed after it was packaged"):
        load_model_package(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"features": ["log_amount", "velocity"]}, r"features \['velocity'\] are not in the"),
        ({"features": []}, "features is empty"),
        ({"features": ["night", "night"]}, "names a column twice"),
        ({"reference": [1.0, 2.0]}, f"reference has 2 values for {NUM_FEATURES} features"),
        ({"format": 2}, "format 2 is not one this build reads"),
    ],
)
def test_a_bad_manifest_is_refused_in_one_line(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        written(tmp_path, **changes)
    assert "\n" not in str(caught.value)


def test_crossed_thresholds_and_unknown_keys_are_refused(tmp_path: Path) -> None:
    path = written(tmp_path)
    manifest = path / MANIFEST_FILE
    text = manifest.read_text(encoding="utf-8")
    manifest.write_text(text.replace("review = 0.5", "review = 0.9"), encoding="utf-8")
    with pytest.raises(ConfigurationError, match=r"review <= decline <= 1, got 0\.9 and 0\.8"):
        load_model_package(path)
    manifest.write_text(text + "\n[extra]\nkey = 1\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="unknown field `extra`"):
        load_model_package(path)


def test_a_bare_onnx_file_or_a_missing_package_says_what_to_do(tmp_path: Path) -> None:
    bare = tmp_path / "model.onnx"
    bare.write_bytes(GRAPH)
    with pytest.raises(ConfigurationError, match="make one with `fraud-model import`"):
        load_model_package(bare)
    with pytest.raises(ConfigurationError, match="is not a directory"):
        load_model_package(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigurationError, match="No such file"):
        load_model_package(tmp_path / "empty")
