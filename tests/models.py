"""Small ONNX models built in tests: crafted to break, to be slow, or to mismatch the features;
and `package`, which makes one a model package the service reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

from scorer.features import FEATURE_NAMES
from scorer.model_package import plain_manifest, write_model_package

#: A feature value at which `poison_model` fails inside ONNX Runtime.
POISON = 7.0


def onnx_model(
    nodes: list[NodeProto],
    initializers: dict[str, np.ndarray],
    output_shape: list[str | int],
    feature_names: tuple[str, ...] = FEATURE_NAMES,
    model_version: str = "test",
) -> bytes:
    """A model from input `features` [batch, len(feature_names)] to output `score`, with the
    metadata the service checks."""
    graph = helper.make_graph(
        nodes,
        model_version,
        [
            helper.make_tensor_value_info(
                "features", TensorProto.FLOAT, ["batch", len(feature_names)]
            )
        ],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, output_shape)],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(
        model, {"feature_names": ",".join(feature_names), "model_version": model_version}
    )
    return bytes(model.SerializeToString())


def package(
    directory: Path,
    model: bytes,
    features: tuple[str, ...] = FEATURE_NAMES,
    version: str = "test",
) -> Path:
    """Write `model` as a model package at `directory` (a manifest naming `features`)."""
    write_model_package(directory, model, plain_manifest(version, version, features))
    return directory


def poison_model() -> bytes:
    """Scores 1.0 for rows of zeros and ones; ONNX Runtime fails on a row holding POISON (an
    index out of bounds), like a model that breaks on one record."""
    return onnx_model(
        [
            helper.make_node("Cast", ["features"], ["index"], to=TensorProto.INT64),
            helper.make_node("Gather", ["table", "index"], ["looked_up"]),
            helper.make_node("ReduceMax", ["looked_up"], ["score"], axes=[1], keepdims=0),
        ],
        {"table": np.ones(2, np.float32)},
        ["batch"],
    )
