"""Small ONNX models built in tests: crafted to break, to be slow, or to mismatch the features;
and `package`, which makes one a model package the service reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.model_package import plain_manifest, write_model_package

#: A feature value at which `poison_model` fails inside ONNX Runtime.
POISON = 7.0
#: A transaction amount above which `amount_poison_model` fails inside ONNX Runtime.
POISON_AMOUNT = 500_000.0


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


def amount_poison_model() -> bytes:
    """Scores like a tiny logistic regression, but its Gather index runs out of bounds (an ONNX
    Runtime error for the whole call) for any row whose amount is above POISON_AMOUNT: a model
    that breaks on real transactions, not on crafted feature rows."""
    rng = np.random.default_rng(1)
    initializers: dict[str, np.ndarray] = {
        "w": rng.normal(0, 0.3, (NUM_FEATURES, 1)).astype(np.float32),
        "b": np.array([-2.0], np.float32),
        "flat": np.array([-1], np.int64),
        "amount_column": np.array(0, np.int64),
        "limit": np.array(np.log1p(POISON_AMOUNT), np.float32),
        "out_of_bounds": np.array(7, np.int64),
        "table": np.zeros(1, np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["features", "w", "b"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["p"]),
        helper.make_node("Reshape", ["p", "flat"], ["p_flat"]),
        helper.make_node("Gather", ["features", "amount_column"], ["log_amount"], axis=1),
        helper.make_node("Greater", ["log_amount", "limit"], ["too_big"]),
        helper.make_node("Cast", ["too_big"], ["too_big_i"], to=TensorProto.INT64),
        helper.make_node("Mul", ["too_big_i", "out_of_bounds"], ["index"]),
        helper.make_node("Gather", ["table", "index"], ["zero_or_crash"], axis=0),
        helper.make_node("Add", ["p_flat", "zero_or_crash"], ["score"]),
    ]
    return onnx_model(nodes, initializers, ["batch"])


#: The side of the matrix `slow_model` multiplies: one multiplication is about 0.27 GFLOP.
SLOW_SIDE = 512


def slow_model(iterations: int, model_version: str = "slow") -> bytes:
    """Scores 0.5 for every row, after `iterations` multiplications of a SLOW_SIDE-square
    matrix, whatever the batch's size: a model that is slow on every call. The matrix is made
    from the input, so ONNX Runtime cannot fold the loop away when it loads the model."""
    rng = np.random.default_rng(5)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["m_in", "w"], ["product"]),
            helper.make_node("Tanh", ["product"], ["m_out"]),
        ],
        "multiply",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("m_in", TensorProto.FLOAT, [SLOW_SIDE, SLOW_SIDE]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("m_out", TensorProto.FLOAT, [SLOW_SIDE, SLOW_SIDE]),
        ],
    )
    nodes = [
        helper.make_node("ReduceSum", ["features"], ["total"], keepdims=0),
        helper.make_node("Mul", ["w", "total"], ["m0"]),
        helper.make_node("Loop", ["trips", "go", "m0"], ["m_last"], body=body),
        helper.make_node("ReduceMean", ["m_last"], ["mean"], keepdims=0),
        helper.make_node("Mul", ["mean", "zero"], ["nothing"]),
        helper.make_node("Mul", ["features", "zero"], ["zeros"]),
        helper.make_node("ReduceMax", ["zeros"], ["row_zeros"], axes=[1], keepdims=0),
        helper.make_node("Add", ["row_zeros", "nothing"], ["shifted"]),
        helper.make_node("Add", ["shifted", "half"], ["score"]),
    ]
    initializers: dict[str, np.ndarray] = {
        "w": (rng.standard_normal((SLOW_SIDE, SLOW_SIDE)) / SLOW_SIDE).astype(np.float32),
        "trips": np.array(iterations, np.int64),
        "go": np.array(True),
        "zero": np.array(0.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    return onnx_model(nodes, initializers, ["batch"], model_version=model_version)


def _logistic_plus(extra: list[NodeProto], initializers: dict[str, np.ndarray]) -> bytes:
    """A tiny logistic regression over every feature, plus `nan_or_zero` (what the `extra`
    nodes compute from `features`): the score, or NaN where that is NaN."""
    rng = np.random.default_rng(2)
    base: dict[str, np.ndarray] = {
        "w": rng.normal(0, 0.3, (NUM_FEATURES, 1)).astype(np.float32),
        "b": np.array([-2.0], np.float32),
        "flat": np.array([-1], np.int64),
        "nan": np.array(np.nan, np.float32),
        "zero": np.array(0.0, np.float32),
    }
    nodes = [
        helper.make_node("Gemm", ["features", "w", "b"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["p"]),
        helper.make_node("Reshape", ["p", "flat"], ["p_flat"]),
        *extra,
        helper.make_node("Add", ["p_flat", "nan_or_zero"], ["score"]),
    ]
    return onnx_model(nodes, {**base, **initializers}, ["batch"])


def nan_above_model(feature: str, limit: float) -> bytes:
    """Scores like a tiny logistic regression, but NaN for every row whose `feature` is above
    `limit`: a model that loads, warms up and scores the all-zeros row, and fails real rows."""
    extra = [
        helper.make_node("Gather", ["features", "column"], ["value"], axis=1),
        helper.make_node("Greater", ["value", "limit"], ["above"]),
        helper.make_node("Where", ["above", "nan", "zero"], ["nan_or_zero"]),
    ]
    return _logistic_plus(
        extra,
        {
            "column": np.array(FEATURE_NAMES.index(feature), np.int64),
            "limit": np.array(limit, np.float32),
        },
    )


def nan_on_real_rows_model() -> bytes:
    """NaN for every row with an amount (every real transaction); a probability for zeros."""
    return nan_above_model("log_amount", 0.0)


#: `card_tx_30d` of a card's second transaction or later (log(1 + count); a card's first is
#: log(2)): where `nan_on_history_model` fails.
SEEN_BEFORE = float(np.log1p(1.5))


def nan_on_history_model() -> bytes:
    """NaN for the rows of a card seen before (its history counts more than this one); a
    probability for zeros and for a card's first transaction (neutral history): a model that
    passes every check without real traffic and fails most of it."""
    return nan_above_model("card_tx_30d", SEEN_BEFORE)


#: `card_since_previous` (log(1 + seconds)) of a card's transaction within a second of its
#: previous one: where `nan_on_burst_model` fails.
BURST = float(np.log1p(1.0))


def nan_on_burst_model() -> bytes:
    """NaN for the rows of a card seen before whose previous transaction was less than a second
    earlier (the tests' traffic: every transaction of a card at the same instant); a probability
    for every other row, the zeros and every typical row (a simulated stream holds no such
    burst): a model that passes every check before it serves, then fails most of that traffic."""
    extra = [
        helper.make_node("Gather", ["features", "history_column"], ["count"], axis=1),
        helper.make_node("Greater", ["count", "seen_before"], ["seen"]),
        helper.make_node("Gather", ["features", "since_column"], ["since"], axis=1),
        helper.make_node("Less", ["since", "burst"], ["soon"]),
        helper.make_node("And", ["seen", "soon"], ["burst_of_seen"]),
        helper.make_node("Where", ["burst_of_seen", "nan", "zero"], ["nan_or_zero"]),
    ]
    return _logistic_plus(
        extra,
        {
            "history_column": np.array(FEATURE_NAMES.index("card_tx_30d"), np.int64),
            "seen_before": np.array(SEEN_BEFORE, np.float32),
            "since_column": np.array(FEATURE_NAMES.index("card_since_previous"), np.int64),
            "burst": np.array(BURST, np.float32),
        },
    )


def holding_model(hold_bytes: int, iterations: int, model_version: str = "holding") -> bytes:
    """Scores 0.5 for every row, after making a float tensor of `hold_bytes` from the input (no
    constant ONNX Runtime could fold away) and holding it through `iterations` multiplications
    of a SLOW_SIDE-square matrix: a model whose every run keeps that much working memory for a
    while."""
    rng = np.random.default_rng(6)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["m_in", "w"], ["product"]),
            helper.make_node("Tanh", ["product"], ["m_out"]),
            helper.make_node("Identity", ["held_in"], ["held_out"]),
        ],
        "hold",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("m_in", TensorProto.FLOAT, [SLOW_SIDE, SLOW_SIDE]),
            helper.make_tensor_value_info("held_in", TensorProto.FLOAT, ["held"]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("m_out", TensorProto.FLOAT, [SLOW_SIDE, SLOW_SIDE]),
            helper.make_tensor_value_info("held_out", TensorProto.FLOAT, ["held"]),
        ],
    )
    nodes = [
        helper.make_node("ReduceSum", ["features"], ["total"], keepdims=0),
        helper.make_node("Mul", ["w", "total"], ["m0"]),
        helper.make_node("Mul", ["total", "zero"], ["zero_at_run"]),
        helper.make_node("Expand", ["zero_at_run", "hold_shape"], ["held0"]),
        helper.make_node("Loop", ["trips", "go", "m0", "held0"], ["m_last", "held"], body=body),
        helper.make_node("ReduceMean", ["m_last"], ["mean"], keepdims=0),
        helper.make_node("ReduceMax", ["held"], ["held_max"], keepdims=0),
        helper.make_node("Add", ["mean", "held_max"], ["both"]),
        helper.make_node("Mul", ["both", "zero"], ["nothing"]),
        helper.make_node("Mul", ["features", "zero"], ["zeros"]),
        helper.make_node("ReduceMax", ["zeros"], ["row_zeros"], axes=[1], keepdims=0),
        helper.make_node("Add", ["row_zeros", "nothing"], ["shifted"]),
        helper.make_node("Add", ["shifted", "half"], ["score"]),
    ]
    initializers: dict[str, np.ndarray] = {
        "w": (rng.standard_normal((SLOW_SIDE, SLOW_SIDE)) / SLOW_SIDE).astype(np.float32),
        "trips": np.array(iterations, np.int64),
        "go": np.array(True),
        "hold_shape": np.array([hold_bytes // 4], np.int64),
        "zero": np.array(0.0, np.float32),
        "half": np.array(0.5, np.float32),
    }
    return onnx_model(nodes, initializers, ["batch"], model_version=model_version)
