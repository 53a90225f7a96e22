"""The two candidate models, by kind (gradient-boosted trees and an MLP): fit one on a fold's
rows, read its log-odds, bake a calibration into it, export it to ONNX under a versioned name.

Everything the training run does to a model that depends on its kind lives here, so the
validation and test folds treat both candidates alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from scorer.features import FEATURE_NAMES, NUM_FEATURES
from training import gbdt, mlp
from training.calibration import Platt

#: The candidates, by kind; the name of each one's package.
MODEL_NAMES = {"gbdt": "fraud-gbdt", "mlp": "fraud-mlp"}
#: The handbook's recipe, reported beside the candidates under this kind.
HANDBOOK = "handbook"
MODEL_RELEASE = "2.5.0"
#: Separates the trainer's random stream from the simulator's for the same seed.
_TRAINER_STREAM = 1

_Floats = npt.NDArray[np.float64]
_Model = gbdt.Trees | list[mlp.Layer]


def fit(
    kind: str, features: npt.NDArray[np.float32], is_fraud: npt.NDArray[np.bool_], seed: int
) -> _Model:
    """One candidate fitted on these training rows; its output is the log-odds of fraud."""
    if kind == "gbdt":
        return gbdt.fit(features, is_fraud, seed)
    return mlp.fit(features, is_fraud, np.random.default_rng((seed, _TRAINER_STREAM)))


def logits(model: _Model, features: npt.NDArray[np.float32]) -> _Floats:
    """The model's log-odds of fraud for these rows (before calibration)."""
    if isinstance(model, gbdt.Trees):
        return gbdt.raw_scores(model, features)
    return mlp.raw_scores(model, features)


def calibrated(model: _Model, platt: Platt) -> _Model:
    """The same model whose log-odds are a·z + b: its sigmoid is the calibrated probability."""
    if isinstance(model, gbdt.Trees):
        return gbdt.calibrated(model, platt.a, platt.b)
    last = model[-1]
    return [*model[:-1], mlp.Layer(last.weights * platt.a, last.bias * platt.a + platt.b)]


def export(kind: str, model: _Model, seed: int, training_rows: int) -> tuple[bytes, str]:
    """The ONNX model and its model_version (the hash of its parameters)."""
    name = MODEL_NAMES[kind]
    arrays: list[npt.NDArray[np.generic]] = (
        list(model) if isinstance(model, gbdt.Trees) else [a for layer in model for a in layer]
    )
    version = f"{name}-{MODEL_RELEASE}-{parameters_digest(arrays)}"
    metadata = {
        "model_version": version,
        "feature_names": ",".join(FEATURE_NAMES),
        "seed": str(seed),
        "training_rows": str(training_rows),
    }
    if isinstance(model, gbdt.Trees):
        return gbdt.export_onnx(model, NUM_FEATURES, name, metadata), version
    return mlp.export_onnx(model, NUM_FEATURES, name, metadata), version


def parameters_digest(arrays: Sequence[npt.NDArray[np.generic]]) -> str:
    """The first 8 hex digits of the sha256 of a model's parameters: its version's suffix."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:8]
