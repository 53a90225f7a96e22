"""Import a trained XGBoost, LightGBM or scikit-learn classifier as a model package.

`import_model` checks the request up front, loads the native model, converts it with the
maintained converters (onnxmltools for XGBoost and LightGBM, skl2onnx for scikit-learn; no
tree is written by hand here), reshapes the graph to the package contract (one float32 input
`features` [batch, len(features)], one output `score` = P(class 1) as float32 [batch]), scores
a sample with both the native model and ONNX Runtime's CPU provider, and writes the package
only when the two agree within the tolerance. Every refusal is a `ConfigurationError` of one
line that says what to fix, raised before anything is written.

The converters and onnx are the `import` extra, so they are imported where they are used: the
service and `fraud-model inspect` run without them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import shutil
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, get_args

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from contracts.errors import ConfigurationError
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
from scorer.runtime import ORT_ERRORS

if TYPE_CHECKING:
    import lightgbm
    import onnx

Framework = Literal["xgboost", "lightgbm", "sklearn"]
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)
#: Native file suffixes each framework's loader reads; LightGBM's text model has no fixed one.
MODEL_SUFFIXES: dict[Framework, tuple[str, ...]] = {
    "xgboost": (".json", ".ubj"),
    "lightgbm": (),
    "sklearn": (".joblib", ".pkl", ".pickle"),
}
SAMPLE_SUFFIXES = (".npy", ".csv")

INPUT_NAME = "features"
OUTPUT_NAME = "score"
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
#: The highest default-domain opset onnxmltools 1.16 converts to; skl2onnx is asked for the
#: same so that every import yields one opset, which every supported ONNX Runtime runs.
TARGET_OPSET = 15
EXTRA_HINT = "pip install 'fraud-scorer[import]'"
#: The converter and the native library each framework needs (import name, pip name).
_CONVERTER: dict[Framework, str] = {
    "xgboost": "onnxmltools",
    "lightgbm": "onnxmltools",
    "sklearn": "skl2onnx",
}
_NATIVE: dict[Framework, tuple[tuple[str, str], ...]] = {
    "xgboost": (("xgboost", "xgboost"),),
    "lightgbm": (("lightgbm", "lightgbm"),),
    "sklearn": (("sklearn", "scikit-learn"), ("joblib", "joblib")),
}
#: Converter messages can run to pages (a node's attributes); an error line keeps this much.
_MESSAGE_CHARS = 300


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


class NativeModel(NamedTuple):
    """A loaded native model and what the import needs to know about it."""

    framework: Framework
    #: What it is, in words ("XGBClassifier", "Pipeline(StandardScaler, LogisticRegression)").
    kind: str
    estimator: Any
    n_features: int
    #: The column names it was trained with, when it kept them.
    column_names: tuple[str, ...] | None
    #: What its class 1 is, in words, for the manifest's output meaning.
    positive_class: str
    #: Library, version and file, for the graph's metadata.
    source: str


class ScoreCheck(NamedTuple):
    """Native against ONNX Runtime scores on the sample."""

    rows: int
    max_abs_diff: float
    #: The sample row where the difference is largest.
    worst_row: int


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
        output=ModelOutput(_meaning(native), request.calibration),
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
    _check_installed(request.framework)


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
        raise ConfigurationError(f"{where}: {_first_line(exc)}") from exc
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


def load_native(framework: Framework, path: Path) -> NativeModel:
    """The native model in `path`; ConfigurationError when it is not a binary classifier."""
    loader = {"xgboost": _load_xgboost, "lightgbm": _load_lightgbm, "sklearn": _load_sklearn}
    try:
        return loader[framework](path)
    except ConfigurationError:
        raise
    except Exception as exc:  # each library has its own errors for a file it cannot read
        raise ConfigurationError(
            f"cannot load {str(path)!r} as a {framework} model: {_first_line(exc)}"
        ) from exc


def check_native(native: NativeModel, features: Sequence[str]) -> None:
    """The model must read as many columns as `features` names, in the same order when it
    kept catalogue names of its own."""
    if native.n_features != len(features):
        raise ConfigurationError(
            f"the {native.kind} reads {native.n_features} features but {len(features)} are "
            f"named: give exactly its {native.n_features} input columns, in its column order"
        )
    names = native.column_names
    if names and set(names) <= set(FEATURE_NAMES) and list(names) != list(features):
        raise ConfigurationError(
            f"the {native.kind} was trained on the columns {list(names)}, which differ from the "
            "features given: name them in the model's column order"
        )


def native_scores(native: NativeModel, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """P(class 1) per row, as the native library computes it."""
    model = native.estimator
    if native.framework == "lightgbm":
        return np.asarray(model.predict(rows), np.float64)
    with warnings.catch_warnings():
        # A model fitted on a DataFrame warns that the rows have no column names; the
        # service's rows never do, and check_native compared the names.
        warnings.filterwarnings("ignore", message="X does not have valid feature names")
        return np.asarray(model.predict_proba(rows)[:, 1], np.float64)


def convert(native: NativeModel) -> bytes:
    """The package's graph: converted, reshaped to one `features` input and one `score`
    output, checked and serialized."""
    import onnx

    converter = _CONVERTER[native.framework]
    try:
        model = _convert(native)
    except Exception as exc:  # the converters raise whatever their internals raise
        raise ConfigurationError(
            f"{converter} {importlib.metadata.version(converter)} cannot convert the "
            f"{native.kind}: {_first_line(exc)} (docs/models.md lists what converts)"
        ) from exc
    _to_package_signature(model, native.n_features)
    model.producer_name = "fraud-model import"
    onnx.helper.set_model_props(
        model,
        {
            "source": f"{native.kind} ({native.source})",
            "converter": f"{converter} {importlib.metadata.version(converter)}",
        },
    )
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise ConfigurationError(
            f"the converted graph fails onnx.checker: {_first_line(exc)}"
        ) from exc
    serialized: bytes = model.SerializeToString()
    return serialized


def onnx_scores(model: bytes, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The graph's scores on ONNX Runtime's CPU provider, the one its tree operators run on."""
    try:
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        (scores,) = session.run([OUTPUT_NAME], {INPUT_NAME: rows})
    except ORT_ERRORS as exc:
        raise ConfigurationError(
            f"ONNX Runtime cannot run the converted graph: {_first_line(exc)}"
        ) from exc
    return np.asarray(scores, np.float32).reshape(-1)


def compare_scores(native: NativeModel, model: bytes, rows: npt.NDArray[np.float32]) -> ScoreCheck:
    """Native against ONNX Runtime scores on `rows`."""
    diff = np.abs(native_scores(native, rows) - onnx_scores(model, rows).astype(np.float64))
    worst = int(np.argmax(diff))
    return ScoreCheck(len(rows), float(diff[worst]), worst)


def _load_xgboost(path: Path) -> NativeModel:
    import xgboost

    model = xgboost.XGBClassifier()
    model.load_model(path)
    booster = model.get_booster()
    objective = json.loads(booster.save_config())["learner"]["objective"]["name"]
    if objective != "binary:logistic":
        raise ConfigurationError(
            f"the XGBoost model has objective {objective!r}: import reads a binary classifier "
            "(binary:logistic), whose predict_proba is the fraud probability"
        )
    names = tuple(booster.feature_names) if booster.feature_names else None
    # onnxmltools reads the trees' dump, which must name features f0, f1, ...
    booster.feature_names = None
    source = f"xgboost {xgboost.__version__}, {path.name}"
    return NativeModel(
        "xgboost", "XGBClassifier", model, booster.num_features(), names, "1", source
    )


def _load_lightgbm(path: Path) -> NativeModel:
    import lightgbm

    booster = lightgbm.Booster(model_file=str(path))
    objective = booster.params.get("objective")
    if objective != "binary":
        raise ConfigurationError(
            f"the LightGBM model has objective {objective!r}: import reads a binary classifier "
            "(objective binary), whose prediction is the fraud probability"
        )
    names = tuple(booster.feature_name())
    source = f"lightgbm {lightgbm.__version__}, {path.name}"
    return NativeModel(
        "lightgbm", "LightGBM Booster", booster, booster.num_feature(), names, "1", source
    )


def _load_sklearn(path: Path) -> NativeModel:
    import joblib
    import sklearn
    from sklearn.pipeline import Pipeline

    model = joblib.load(path)
    kind = type(model).__name__
    library = type(model).__module__.partition(".")[0]
    if library in ("xgboost", "lightgbm"):
        raise ConfigurationError(
            f"{str(path)!r} holds a {kind}: save it in {library}'s own format and import it "
            f"with --framework {library} (docs/models.md)"
        )
    if isinstance(model, Pipeline):
        kind += f"({', '.join(type(step).__name__ for _, step in model.steps)})"
    classes = getattr(model, "classes_", None)
    if not hasattr(model, "predict_proba") or classes is None or len(classes) != 2:
        raise ConfigurationError(
            f"{str(path)!r} holds a {kind}: import reads a fitted binary classifier (or a "
            "Pipeline ending in one) with predict_proba"
        )
    names = getattr(model, "feature_names_in_", None)
    return NativeModel(
        "sklearn",
        kind,
        model,
        int(model.n_features_in_),
        None if names is None else tuple(str(name) for name in names),
        repr(classes[1].item() if hasattr(classes[1], "item") else classes[1]),
        f"scikit-learn {sklearn.__version__}, {path.name}",
    )


def _convert(native: NativeModel) -> onnx.ModelProto:
    n = native.n_features
    if native.framework == "sklearn":
        import skl2onnx
        from skl2onnx.common.data_types import (
            FloatTensorType as SklFloat,
        )

        model = native.estimator
        final = model.steps[-1][1] if hasattr(model, "steps") else model
        converted: onnx.ModelProto = skl2onnx.to_onnx(
            model,
            initial_types=[(INPUT_NAME, SklFloat([None, n]))],
            target_opset=TARGET_OPSET,
            # Probabilities as a tensor, not a list of per-class dictionaries.
            options={id(final): {"zipmap": False}},
        )
        return converted
    import onnxmltools
    from onnxmltools.convert.common.data_types import (
        FloatTensorType,
    )

    inputs = [(INPUT_NAME, FloatTensorType([None, n]))]
    if native.framework == "xgboost":
        converted = onnxmltools.convert_xgboost(
            native.estimator, initial_types=inputs, target_opset=TARGET_OPSET
        )
    else:
        converted = onnxmltools.convert_lightgbm(
            _float32_thresholds(native.estimator),
            initial_types=inputs,
            target_opset=TARGET_OPSET,
            zipmap=False,
        )
    return converted


def _float32_thresholds(booster: lightgbm.Booster) -> lightgbm.Booster:
    """A copy of `booster` whose split thresholds are each the largest float32 not above it.

    LightGBM sends x <= threshold left, comparing in double; ONNX's TreeEnsemble compares in
    float32, and onnxmltools rounds each threshold to the nearest float32, which sends a float32
    input lying between the two the other way (score differences of 1.5e-5 on simulator rows).
    For float32 inputs, the service's, the copy takes every branch the original takes.
    """
    import lightgbm

    lines = []
    for line in booster.model_to_string().splitlines():
        if line.startswith("tree_sizes="):
            continue  # the trees' byte sizes, which change; LightGBM reads trees without them
        if line.startswith("threshold="):
            exact = np.array(line.removeprefix("threshold=").split(), np.float64)
            below = exact.astype(np.float32)
            below = np.where(below > exact, np.nextafter(below, np.float32(-np.inf)), below)
            line = "threshold=" + " ".join(repr(float(value)) for value in below)
        lines.append(line)
    return lightgbm.Booster(model_str="\n".join(lines) + "\n")


def _to_package_signature(model: onnx.ModelProto, n_features: int) -> None:
    """Keep one output, `score` = probabilities[:, 1] as float32 [batch], and only the nodes
    it needs; the converters' `label` output goes."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inputs = [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}]
    if inputs != [INPUT_NAME]:
        raise ConfigurationError(f"the converted graph reads {inputs}, not one {INPUT_NAME!r}")
    probabilities = next((o for o in graph.output if o.name == "probabilities"), None)
    if probabilities is None or probabilities.type.tensor_type.elem_type != TensorProto.FLOAT:
        raise ConfigurationError(
            f"the converted graph has no float 'probabilities' output "
            f"({[o.name for o in graph.output]})"
        )
    # A scalar index: Gather drops the class axis, [batch, 2] → [batch].
    graph.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "score.class_1"))
    graph.node.append(
        helper.make_node(
            "Gather", [probabilities.name, "score.class_1"], [OUTPUT_NAME], "score", axis=1
        )
    )
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"]))
    del graph.input[:]
    graph.input.append(
        helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", n_features])
    )
    needed = {OUTPUT_NAME}
    kept = []
    for node in reversed(graph.node):  # nodes are in topological order
        if needed.intersection(node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    for listing in (graph.initializer, graph.value_info):
        kept_entries = [entry for entry in listing if entry.name in needed]
        del listing[:]
        listing.extend(kept_entries)
    # One entry per domain (skl2onnx may repeat one); Gather needs the default domain, which
    # a graph of ai.onnx.ml operators alone (onnxmltools' XGBoost) does not declare.
    versions: dict[str, int] = {}
    for opset in model.opset_import:
        versions[opset.domain] = max(opset.version, versions.get(opset.domain, 0))
    versions.setdefault("", TARGET_OPSET)
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in sorted(versions.items()))
    model.ir_version = max(
        model.ir_version, helper.find_min_ir_version_for(list(model.opset_import))
    )


def _meaning(native: NativeModel) -> str:
    if native.framework == "lightgbm":
        return "P(fraud) from the imported LightGBM Booster's predict (objective binary)"
    return (
        f"P(fraud) from the imported {native.framework} {native.kind}'s predict_proba "
        f"(class {native.positive_class})"
    )


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


def _check_installed(framework: Framework) -> None:
    converters = [p for p in ("onnx", _CONVERTER[framework]) if not _installed(p)]
    if converters:
        raise ConfigurationError(
            f"importing a {framework} model needs {' and '.join(converters)}: {EXTRA_HINT}"
        )
    native = [pip for module, pip in _NATIVE[framework] if not _installed(module)]
    if native:
        raise ConfigurationError(
            f"loading a {framework} model needs its library: pip install {' '.join(native)}"
        )


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


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


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= _MESSAGE_CHARS else line[:_MESSAGE_CHARS] + "…"
