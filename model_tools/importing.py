"""Import a trained XGBoost, LightGBM or scikit-learn classifier as a model package.

`import_model` checks the request up front, loads and converts the native model
(`model_tools/conversion.py`), scores a sample with both, and writes the package only when the
two agree within the tolerance. Every refusal is a `ConfigurationError` of one line that says
what to fix, raised before anything is written.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from model_tools.conversion import (
    FRAMEWORKS,
    Framework,
    NativeModel,
    ScoreCheck,
    check_installed,
    check_native,
    compare_scores,
    convert,
    error_first_line,
    load_native,
    native_scores,
    onnx_scores,
    output_meaning,
)
from plumbing.errors import ConfigurationError
from scorer.decisions import DEFAULT_DECLINE_THRESHOLD, DEFAULT_REVIEW_THRESHOLD
from scorer.drift import drift_reference, most_influential
from scorer.features import FEATURE_NAMES
from scorer.model_package import (
    CARD_FILE,
    FORMAT,
    MANIFEST_FILE,
    ONNX_FILE,
    Calibration,
    Manifest,
    ModelInfo,
    ModelOutput,
    ModelPackage,
    ThresholdChoice,
    Training,
    load_model_package,
    write_model_package,
)

#: Native file suffixes each framework's loader reads; LightGBM's text model has no fixed one.
MODEL_SUFFIXES: dict[Framework, tuple[str, ...]] = {
    "xgboost": (".json", ".ubj"),
    "lightgbm": (),
    "sklearn": (".joblib", ".pkl", ".pickle"),
}
SAMPLE_SUFFIXES = (".npy", ".csv")
DEFAULT_TOLERANCE = 1e-5
#: A converted model whose scores move by more than this is a different model, whatever the
#: user is prepared to accept: fix the conversion instead.
MAX_TOLERANCE = 1e-2
#: Fewer rows reach too few of an ensemble's leaves to say that the conversion agrees.
MIN_SAMPLE_ROWS = 100
DEFAULT_REVIEW = DEFAULT_REVIEW_THRESHOLD
DEFAULT_DECLINE = DEFAULT_DECLINE_THRESHOLD
DEFAULT_CHOSEN_BY = (
    "not chosen: the defaults of fraud-model import; tune them for this model "
    "(FRAUD_REVIEW_THRESHOLD / FRAUD_DECLINE_THRESHOLD override them)"
)
NOT_GIVEN = "not given at import"


@dataclass(frozen=True)
class ImportRequest:
    """Everything `fraud-model import` was asked for."""

    framework: Framework
    model_file: Path
    #: The model's input columns, in its column order, named from the feature catalogue.
    features: tuple[str, ...]
    out: Path
    name: str
    version: str
    #: Rows of the model's input columns (.npy or .csv) for the check and the reference row.
    sample: Path
    tolerance: float = DEFAULT_TOLERANCE
    review: float = DEFAULT_REVIEW
    decline: float = DEFAULT_DECLINE
    thresholds_chosen_by: str = DEFAULT_CHOSEN_BY
    calibration: Calibration = "none"
    training_data: str = NOT_GIVEN
    training_window: str = NOT_GIVEN
    metrics: Mapping[str, float] = field(default_factory=dict)
    #: Replace the package already at `out`.
    force: bool = False


class ImportResult(NamedTuple):
    package: ModelPackage
    check: ScoreCheck
    native: NativeModel


def import_model(request: ImportRequest) -> ImportResult:
    """Convert, check and write the package; ConfigurationError (nothing written) on refusal."""
    check_request(request)
    rows = read_sample(request.sample, request.features)
    native = load_native(request.framework, request.model_file)
    check_native(native, request.features)
    onnx_model = convert(native)
    check = compare_scores(native, onnx_model, rows)
    if not check.max_abs_diff <= request.tolerance:
        worst = rows[check.worst_row : check.worst_row + 1]
        raise ConfigurationError(
            f"the ONNX graph's scores differ from the native model's by up to "
            f"{check.max_abs_diff:.3g} (sample row {check.worst_row}: native "
            f"{float(native_scores(native, worst)[0]):.6g}, ONNX "
            f"{float(onnx_scores(onnx_model, worst)[0]):.6g}) over {check.rows} rows, above "
            f"--tolerance {request.tolerance:g}; nothing written: the converter does not "
            "reproduce this model (docs/models.md, Limits)"
        )
    manifest = Manifest(
        format=FORMAT,
        model=ModelInfo(request.name, request.version),
        features=list(request.features),
        output=ModelOutput(output_meaning(native), request.calibration),
        thresholds=ThresholdChoice(request.review, request.decline, request.thresholds_chosen_by),
        training=Training(request.training_data, request.training_window, dict(request.metrics)),
        onnx_sha256="",
        reference=[float(value) for value in np.median(rows, axis=0)],
        drift=drift_reference(
            f"the import sample ({len(rows)} rows), scored by the ONNX graph",
            onnx_scores(onnx_model, rows),
            rows,
            request.features,
            most_influential(lambda part: onnx_scores(onnx_model, part), rows, request.features),
        ),
    )
    return ImportResult(_write(request.out, onnx_model, manifest), check, native)


def check_request(request: ImportRequest) -> None:
    """Everything that can be checked before a model is loaded: names, paths, numbers,
    installed packages."""
    if request.framework not in FRAMEWORKS:
        raise ConfigurationError(
            f"framework {request.framework!r} is not one of {', '.join(FRAMEWORKS)}"
        )
    check_feature_names(request.features)
    if not request.model_file.is_file():
        raise ConfigurationError(f"model file {str(request.model_file)!r} does not exist")
    suffixes = MODEL_SUFFIXES[request.framework]
    if suffixes and request.model_file.suffix.lower() not in suffixes:
        raise ConfigurationError(
            f"model file {str(request.model_file)!r}: a {request.framework} model is read from "
            f"{' or '.join(suffixes)}; save it in one of those or pick the right --framework"
        )
    if not request.sample.is_file():
        raise ConfigurationError(f"sample {str(request.sample)!r} does not exist")
    if request.sample.suffix.lower() not in SAMPLE_SUFFIXES:
        raise ConfigurationError(
            f"sample {str(request.sample)!r}: give a .npy or .csv file of feature rows"
        )
    if not 0.0 <= request.tolerance <= MAX_TOLERANCE:  # also refuses NaN
        raise ConfigurationError(
            f"--tolerance must be between 0 and {MAX_TOLERANCE:g}, got {request.tolerance:g}"
        )
    if not 0.0 <= request.review <= request.decline <= 1.0:
        raise ConfigurationError(
            "thresholds must satisfy 0 <= --review <= --decline <= 1, got "
            f"{request.review:g} and {request.decline:g}"
        )
    for option, text in (("--name", request.name), ("--version", request.version)):
        if not text.strip() or text != text.strip():
            raise ConfigurationError(f"{option} {text!r}: give a non-empty value without spaces")
    bad = {name: value for name, value in request.metrics.items() if not math.isfinite(value)}
    if bad:
        raise ConfigurationError(f"--metric values must be finite numbers, got {bad}")
    _check_out(request.out, request.force)
    check_installed(request.framework)


def check_feature_names(features: Sequence[str]) -> None:
    """The model's column names must be distinct catalogue names."""
    if not features:
        raise ConfigurationError("no features named: give the model's input columns in order")
    unknown = [name for name in features if name not in FEATURE_NAMES]
    if unknown:
        hints = [
            f"{name!r} → {close[0]!r}"
            for name in unknown
            if (close := get_close_matches(name, FEATURE_NAMES, n=1))
        ]
        raise ConfigurationError(
            f"features {unknown} are not in the feature catalogue"
            + (f" (did you mean {', '.join(hints)}?)" if hints else "")
            + f"; valid names: {', '.join(FEATURE_NAMES)} (see docs/features.md)"
        )
    twice = sorted({name for name in features if list(features).count(name) > 1})
    if twice:
        raise ConfigurationError(f"features {twice} are named more than once")


def read_sample(path: Path, features: Sequence[str]) -> npt.NDArray[np.float32]:
    """Feature rows as float32 [rows, len(features)], the model's columns in its order.

    A .npy matrix, or a headerless CSV, holds exactly the model's columns in order. A CSV with
    a header of catalogue names may hold more (the full catalogue matrix): its columns are
    picked by name.
    """
    where = f"sample {str(path)!r}"
    try:
        if path.suffix.lower() == ".npy":
            matrix = np.load(path, allow_pickle=False)
            header = None
        else:
            with path.open(encoding="utf-8") as file:
                first = file.readline()
            cells = [cell.strip().strip('"') for cell in first.split(",")]
            header = None if all(_is_number(cell) for cell in cells) else cells
            matrix = np.loadtxt(
                path, delimiter=",", skiprows=0 if header is None else 1, ndmin=2, dtype=np.float64
            )
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{where}: {error_first_line(exc)}") from exc
    if matrix.ndim != 2 or not np.issubdtype(matrix.dtype, np.number):
        raise ConfigurationError(f"{where}: need a numeric matrix [rows, columns]")
    if header is not None:
        missing = [name for name in features if name not in header]
        if missing:
            raise ConfigurationError(f"{where}: its header lacks the model's columns {missing}")
        if len(header) != matrix.shape[1]:
            raise ConfigurationError(
                f"{where}: the header names {len(header)} columns, the rows have {matrix.shape[1]}"
            )
        matrix = matrix[:, [header.index(name) for name in features]]
    elif matrix.shape[1] != len(features):
        raise ConfigurationError(
            f"{where} has {matrix.shape[1]} columns but the model reads {len(features)}: give "
            "the model's columns in its order, or a CSV whose header names its columns"
        )
    rows = np.ascontiguousarray(matrix, dtype=np.float32)
    if len(rows) < MIN_SAMPLE_ROWS:
        raise ConfigurationError(
            f"{where} has {len(rows)} rows: give at least {MIN_SAMPLE_ROWS}, ideally a few "
            "thousand held-out rows of the model's own data"
        )
    bad_rows = np.flatnonzero(~np.isfinite(rows).all(axis=1))
    if len(bad_rows):
        raise ConfigurationError(
            f"{where}: row {int(bad_rows[0])} (and {len(bad_rows) - 1} more) holds a value that "
            "is not a finite float32; the service's feature rows are always finite"
        )
    return rows


def _check_out(out: Path, force: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigurationError(f"--out {str(out)!r} is a file: name a directory")
    contents = {path.name for path in out.iterdir()}
    if contents and not force:
        raise ConfigurationError(
            f"--out {str(out)!r} is not empty: name a new directory, or pass --force to replace "
            "the package there"
        )
    other = contents - {MANIFEST_FILE, ONNX_FILE, CARD_FILE}
    if other:
        raise ConfigurationError(
            f"--force replaces a model package, but {str(out)!r} also holds {sorted(other)}: "
            "name another --out"
        )


def _write(out: Path, onnx_model: bytes, manifest: Manifest) -> ModelPackage:
    """Write into a sibling directory and move it into place, so that a failure leaves `out`
    as it was and a replaced package leaves no file of the old one behind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.importing-", dir=out.parent))
    try:
        write_model_package(staging, onnx_model, manifest)
        if out.exists():  # empty, or a package that _check_out let --force replace
            old = staging.with_name(staging.name + "-old")
            out.rename(old)
            staging.rename(out)
            shutil.rmtree(old)
        else:
            staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return load_model_package(out)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
