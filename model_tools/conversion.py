"""Convert a native XGBoost, LightGBM or scikit-learn classifier to the package's ONNX graph.

`load_native` reads the model file with its own library; `convert` converts it with the
maintained converters (onnxmltools for XGBoost and LightGBM, skl2onnx for scikit-learn; no tree
is written by hand here) and reshapes the graph to the package contract: one float32 input
`features` [batch, len(features)], one output `score` = P(class 1) as float32 [batch].
`compare_scores` scores a sample with both the native model and ONNX Runtime's CPU provider.

The converters and onnx are the `import` extra, so they are imported where they are used:
the service and `fraud-model inspect` run without them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, get_args

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from plumbing.errors import ConfigurationError
from scorer.features import FEATURE_NAMES
from scorer.runtime import ORT_ERRORS

if TYPE_CHECKING:
    import lightgbm
    import onnx

Framework = Literal["xgboost", "lightgbm", "sklearn"]
FRAMEWORKS: tuple[Framework, ...] = get_args(Framework)

INPUT_NAME = "features"
OUTPUT_NAME = "score"
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


def load_native(framework: Framework, path: Path) -> NativeModel:
    """The native model in `path`; ConfigurationError when it is not a binary classifier."""
    loader = {"xgboost": _load_xgboost, "lightgbm": _load_lightgbm, "sklearn": _load_sklearn}
    try:
        return loader[framework](path)
    except ConfigurationError:
        raise
    except Exception as exc:  # each library has its own errors for a file it cannot read
        raise ConfigurationError(
            f"cannot load {str(path)!r} as a {framework} model: {error_first_line(exc)}"
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
            f"{native.kind}: {error_first_line(exc)} (docs/models.md lists what converts)"
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
            f"the converted graph fails onnx.checker: {error_first_line(exc)}"
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
            f"ONNX Runtime cannot run the converted graph: {error_first_line(exc)}"
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


def output_meaning(native: NativeModel) -> str:
    """What the package's score is, in words, for its manifest."""
    if native.framework == "lightgbm":
        return "P(fraud) from the imported LightGBM Booster's predict (objective binary)"
    return (
        f"P(fraud) from the imported {native.framework} {native.kind}'s predict_proba "
        f"(class {native.positive_class})"
    )


def check_installed(framework: Framework) -> None:
    """ConfigurationError naming what to install when the converter or the native library of
    `framework` is missing (checked before anything is loaded)."""
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


def error_first_line(exc: BaseException) -> str:
    """An error's first line, cut at _MESSAGE_CHARS: converter messages can run to pages."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= _MESSAGE_CHARS else line[:_MESSAGE_CHARS] + "…"
