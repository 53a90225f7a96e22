"""A model package: the directory the service scores with (`FRAUD_MODEL_PATH`).

    <package>/model.onnx    the graph: one float32 input [batch, len(features)], one score out
    <package>/model.toml    the manifest (`Manifest`): what the graph reads and what it means
    <package>/MODEL_CARD.md optional: the long-form card

The manifest names the graph's input columns, in order, from the feature catalogue
(`scorer/catalogue.py`, docs/features.md): a package may read any subset of what the service
computes, in any order. `load_model_package` checks everything that can be checked without
running the graph (the file's hash, each feature's name, the thresholds); `OnnxScorer` checks the
graph's inputs and outputs against it. Every check fails with one line that says what to fix.

`fraud-model import` writes a package from an XGBoost, LightGBM or scikit-learn model, and
`python -m training` writes the shipped one; `fraud-model inspect` prints one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from plumbing.bounded_read import read_bounded
from plumbing.errors import ConfigurationError
from scorer.decisions import DEFAULT_THRESHOLDS, Thresholds
from scorer.drift import DriftReference
from scorer.features import FEATURE_NAMES

MANIFEST_FILE = "model.toml"
ONNX_FILE = "model.onnx"
CARD_FILE = "MODEL_CARD.md"
#: The manifest layout this build reads; a later layout bumps it.
FORMAT = 1
#: The largest model.toml read. A manifest is a few kilobytes (the shipped one 5 KB, with its
#: drift reference); tomllib parses some shapes (long dotted table names) in quadratic time,
#: so the bound also bounds the parse: about half a second at this size.
MAX_MANIFEST_BYTES = 32 * 1024
#: The largest model.onnx read (it is held in memory whole, and ONNX Runtime copies it): far
#: past any model that scores within a decision deadline.
MAX_ONNX_BYTES = 1024 * 1024 * 1024

Calibration = Literal["none", "platt", "isotonic"]


class ModelInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    #: Carried by every decision (`model_version`).
    version: str


class ModelOutput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    #: What the score means, in words (for example "probability of fraud, calibrated").
    meaning: str
    #: How the raw output was calibrated: none, platt or isotonic.
    calibration: Calibration = "none"


class ThresholdChoice(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The default cut-offs (FRAUD_REVIEW_THRESHOLD / FRAUD_DECLINE_THRESHOLD override them)."""

    review: float
    decline: float
    #: How they were chosen, in words: the goal and the data it was measured on.
    chosen_by: str
    #: [low, high]: the share of decisions at review or decline that live traffic should stay
    #: within at these thresholds (scorer/flag_rate.py; FraudFlagRateUnexpected). Empty: not
    #: stated, and the alert stays silent for this package.
    expected_flag_rate: list[float] = msgspec.field(default_factory=list)


class Training(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    #: What it was trained on.
    data: str
    #: The training window, in words or dates.
    window: str
    #: Validation figures by name (for example auc, average_precision).
    metrics: dict[str, float] = msgspec.field(default_factory=dict)


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`model.toml`, field for field."""

    format: int
    model: ModelInfo
    #: The graph's input columns, in order, each named from the feature catalogue.
    features: list[str]
    output: ModelOutput
    thresholds: ThresholdChoice
    training: Training
    #: sha256 of model.onnx, hex.
    onnx_sha256: str
    #: A typical legitimate row (same order as `features`): reason codes measure each
    #: feature's contribution against it. Empty: reasons are off for this package.
    reference: list[float] = msgspec.field(default_factory=list)
    #: Histograms of the validation data's score and most used features: live traffic's PSI
    #: against them is the drift metrics' (scorer/drift.py). None: no drift metrics.
    drift: DriftReference | None = None


class ModelPackage(msgspec.Struct, frozen=True):
    """A loaded, checked package."""

    path: Path
    manifest: Manifest
    onnx: bytes

    @property
    def version(self) -> str:
        return self.manifest.model.version

    @property
    def thresholds(self) -> Thresholds:
        """The manifest's default cut-offs."""
        return Thresholds(self.manifest.thresholds.review, self.manifest.thresholds.decline)

    @property
    def feature_index(self) -> npt.NDArray[np.intp]:
        """Where each of the graph's inputs sits in the catalogue's feature matrix."""
        column = {name: i for i, name in enumerate(FEATURE_NAMES)}
        return np.array([column[name] for name in self.manifest.features], np.intp)

    @property
    def reference(self) -> npt.NDArray[np.float32] | None:
        """The reference row in the graph's input order, or None when the package has none."""
        if not self.manifest.reference:
            return None
        return np.asarray(self.manifest.reference, np.float32)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_model_package(path: Path) -> ModelPackage:
    """Read and check the package at `path` (its directory or its model.toml).

    Raises ConfigurationError, one line naming the package and what to fix.
    """
    directory = path.parent if path.name == MANIFEST_FILE else path
    where = str(directory)
    if path.suffix == ".onnx" and path.is_file():
        raise ConfigurationError(
            f"{where!r} is a bare ONNX file; the service reads a model package (a directory "
            f"with {ONNX_FILE} and {MANIFEST_FILE}): make one with `fraud-model import`"
        )
    if not directory.is_dir():
        raise ConfigurationError(f"model package {where!r} is not a directory")
    try:
        text = read_bounded(
            directory / MANIFEST_FILE,
            MAX_MANIFEST_BYTES,
            f"model package {where!r}: {MANIFEST_FILE}",
        )
        onnx = read_bounded(
            directory / ONNX_FILE, MAX_ONNX_BYTES, f"model package {where!r}: {ONNX_FILE}"
        )
        raw = tomllib.loads(text.decode("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"model package {where!r}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"model package {where!r}: {MANIFEST_FILE}: {exc}") from exc
    except RecursionError:  # tomllib descends one Python frame per level of nesting
        raise ConfigurationError(
            f"model package {where!r}: {MANIFEST_FILE} nests arrays or tables too deep"
        ) from None
    manifest = parse_manifest(raw, where)
    digest = sha256_hex(onnx)
    if digest != manifest.onnx_sha256.lower():
        raise ConfigurationError(
            f"model package {where!r}: {ONNX_FILE} has sha256 {digest} but the manifest says "
            f"{manifest.onnx_sha256}: the file changed after it was packaged; package it again"
        )
    return ModelPackage(directory, manifest, onnx)


def promote(package: Path, source: Path) -> Path | None:
    """Make the link `source` name `package` (checked first), in one atomic rename, so a
    replica polling the source never reads a half-made link; returns what it named before
    (None: it did not exist). ConfigurationError when `source` is not a link or `package`
    does not load."""
    load_model_package(package)
    if source.exists() and not source.is_symlink():
        raise ConfigurationError(
            f"model source {str(source)!r} is not a symbolic link: move the package there aside "
            f"and point FRAUD_MODEL_PATH at a link to it (ln -s DIR {source})"
        )
    before = Path(os.path.realpath(source)) if source.is_symlink() else None
    staged = source.with_name(f".{source.name}.promoting")
    staged.unlink(missing_ok=True)
    staged.symlink_to(package.resolve(), target_is_directory=True)
    os.replace(staged, source)
    return before


def parse_manifest(raw: dict[str, Any], where: str = "manifest") -> Manifest:
    """A manifest from its TOML document, checked; ConfigurationError on any mismatch."""
    try:
        manifest = msgspec.convert(raw, Manifest)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(f"model package {where!r}: {MANIFEST_FILE}: {exc}") from exc
    problem = _manifest_problem(manifest)
    if problem:
        raise ConfigurationError(f"model package {where!r}: {MANIFEST_FILE}: {problem}")
    return manifest


def _manifest_problem(manifest: Manifest) -> str | None:
    if manifest.format != FORMAT:
        return f"format {manifest.format} is not one this build reads ({FORMAT})"
    unknown = [name for name in manifest.features if name not in FEATURE_NAMES]
    if unknown:
        return (
            f"features {unknown} are not in the feature catalogue this build computes "
            "(docs/features.md)"
        )
    if not manifest.features:
        return "features is empty: name the graph's input columns"
    if len(set(manifest.features)) != len(manifest.features):
        return "features names a column twice"
    if manifest.reference and len(manifest.reference) != len(manifest.features):
        return (
            f"reference has {len(manifest.reference)} values for {len(manifest.features)} features"
        )
    if not all(math.isfinite(value) for value in manifest.reference):
        return "reference holds a value that is not finite"
    if manifest.drift is not None:
        problem = _drift_problem(manifest.drift, manifest.features)
        if problem:
            return f"drift: {problem}"
    review, decline = manifest.thresholds.review, manifest.thresholds.decline
    if not 0.0 <= review <= decline <= 1.0:
        return f"thresholds must satisfy 0 <= review <= decline <= 1, got {review} and {decline}"
    flag_rate = manifest.thresholds.expected_flag_rate
    if flag_rate and not (len(flag_rate) == 2 and 0.0 <= flag_rate[0] <= flag_rate[1] <= 1.0):
        return (
            "thresholds.expected_flag_rate must be [low, high] with 0 <= low <= high <= 1, "
            f"got {flag_rate}"
        )
    return None


def _drift_problem(drift: DriftReference, features: list[str]) -> str | None:
    unknown = [name for name in drift.features if name not in features]
    if unknown:
        return f"features {unknown} are not among the package's features"
    for name, histogram in [("score", drift.score), *drift.features.items()]:
        edges, shares = histogram.edges, histogram.shares
        if len(shares) != len(edges) + 1 or any(b <= a for a, b in itertools.pairwise(edges)):
            return f"{name}: needs increasing edges and one more share than edges"
        if not all(math.isfinite(v) for v in [*edges, *shares]) or min(shares) < 0:
            return f"{name}: edges and shares must be finite, shares >= 0"
    return None


def plain_manifest(
    name: str,
    version: str,
    features: Sequence[str] = FEATURE_NAMES,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> Manifest:
    """A manifest that says no more than the graph's inputs, for models made in code (tests,
    benchmarks): no training record, no reference row."""
    return Manifest(
        format=FORMAT,
        model=ModelInfo(name, version),
        features=list(features),
        output=ModelOutput(meaning="fraud score in [0, 1]"),
        thresholds=ThresholdChoice(*thresholds, chosen_by="set in code"),
        training=Training(data="none recorded", window="none recorded"),
        onnx_sha256="",
    )


def write_model_package(
    directory: Path, onnx: bytes, manifest: Manifest, card: str | None = None
) -> ModelPackage:
    """Write a package (the manifest's hash is set from `onnx`); returns it, loaded back."""
    manifest = msgspec.structs.replace(manifest, onnx_sha256=sha256_hex(onnx))
    parse_manifest(msgspec.to_builtins(manifest))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / ONNX_FILE).write_bytes(onnx)
    (directory / MANIFEST_FILE).write_text(manifest_toml(manifest), encoding="utf-8")
    if card is not None:
        (directory / CARD_FILE).write_text(card, encoding="utf-8")
    return load_model_package(directory)


def manifest_toml(manifest: Manifest) -> str:
    """The manifest as TOML: top-level keys first, then one table per section."""
    document = msgspec.to_builtins(manifest)
    lines = ["# A fraud-scorer model package manifest (docs/models.md)."]
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in document.items():
        if value is None:
            continue
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    while tables:
        name, table = tables.pop(0)
        lines.append(f"\n[{name}]")
        for key, value in table.items():
            if isinstance(value, dict):
                tables.insert(0, (f"{name}.{_toml_key(key)}", value))
            else:
                lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_key(key: str) -> str:
    """A bare key where TOML allows one; quoted otherwise (a metric named "recall@1%" or
    "auc_0.5" would read back as another key, or not at all)."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        if len(value) > 4:
            return "[\n" + "".join(f"    {_toml_value(v)},\n" for v in value) + "]"
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")
