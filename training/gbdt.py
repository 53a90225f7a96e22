"""Gradient-boosted trees, trained with LightGBM and compiled to plain tensor operations.

ONNX's tree operators (ai.onnx.ml TreeEnsemble*) have no CUDA kernels, so the ensemble is
compiled the way Hummingbird's GEMM strategy does it, into operators every execution provider
runs: for T trees padded to I internal nodes and L leaves each,

    x [B, F] ─Concat(a zero row)─Gather(features)→ [B, T·I] ─Greater(thresholds)→ go right (0/1)
      ─Reshape/Transpose→ [T, B, I] ─MatMul(paths [T, I, L])→ [T, B, L]
      ─Equal(right turns per leaf [T, 1, L])→ the leaf each tree reaches (one-hot)
      ─MatMul(leaf values [T, L, 1])→ [T, B, 1] ─ReduceSum over trees, + base─Sigmoid→
      ─Slice(the zero row off)→ score

paths[t, n, l] is +1 when the way to leaf l turns right at node n, -1 when it turns left, 0 when
n is not on it; a row reaches l exactly when its right turns on that way add up to the number of
right turns, so one matrix product finds every leaf. LightGBM sends x <= threshold left; the
float32 threshold is the largest float32 not above LightGBM's double, so float32 inputs take the
same branches as in LightGBM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import lightgbm
import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from training.onnx_export import INPUT_NAME, OUTPUT_NAME, finish_model

#: Chosen on the validation folds before the test folds (see the model card).
PARAMS: dict[str, Any] = {
    "objective": "binary",
    "learning_rate": 0.03,
    "num_leaves": 16,
    "max_depth": 5,
    "min_child_samples": 40,
    "subsample": 0.8,
    "subsample_freq": 1,
    "colsample_bytree": 0.8,
    "reg_lambda": 1.0,
    "deterministic": True,
    "force_row_wise": True,
    "num_threads": 1,
    "verbose": -1,
}
NUM_TREES = 300


class Trees(NamedTuple):
    """A tree ensemble as padded tensors (see the module docstring)."""

    feature: npt.NDArray[np.int64]  # [T, I]
    threshold: npt.NDArray[np.float32]  # [T, I]
    paths: npt.NDArray[np.float32]  # [T, I, L]
    right_turns: npt.NDArray[np.float32]  # [T, 1, L]; -1 for padding leaves
    leaf_value: npt.NDArray[np.float32]  # [T, L, 1]
    base: float


def fit(features: npt.NDArray[np.float32], is_fraud: npt.NDArray[np.bool_], seed: int) -> Trees:
    """Train the ensemble and return it as tensors."""
    params = {**PARAMS, "seed": seed}
    data = lightgbm.Dataset(features, is_fraud.astype(np.float64), params={"verbose": -1})
    booster = lightgbm.train(params, data, num_boost_round=NUM_TREES)
    return compile_trees(booster.dump_model())


def _float32_at_most(value: float) -> np.float32:
    """The largest float32 that is <= value."""
    rounded = np.float32(value)
    if float(rounded) > value:
        rounded = np.nextafter(rounded, np.float32(-np.inf))
    return np.float32(rounded)


def compile_trees(dump: Mapping[str, Any]) -> Trees:
    """Padded tensors of a LightGBM model dump (`Booster.dump_model()`)."""
    trees = [info["tree_structure"] for info in dump["tree_info"]]
    walked = [_walk(tree) for tree in trees]
    internal = max(1, max(len(nodes) for nodes, _ in walked))
    leaves = internal + 1
    count = len(trees)
    feature = np.zeros((count, internal), np.int64)
    threshold = np.full((count, internal), np.inf, np.float32)
    paths = np.zeros((count, internal, leaves), np.float32)
    right_turns = np.full((count, 1, leaves), -1.0, np.float32)
    leaf_value = np.zeros((count, leaves, 1), np.float32)
    for t, (nodes, leaf_list) in enumerate(walked):
        for n, (split_feature, split_threshold) in enumerate(nodes):
            feature[t, n] = split_feature
            threshold[t, n] = _float32_at_most(split_threshold)
        for leaf, (value, way) in enumerate(leaf_list):
            leaf_value[t, leaf, 0] = value
            right_turns[t, 0, leaf] = sum(1 for _, right in way if right)
            for node, right in way:
                paths[t, node, leaf] = 1.0 if right else -1.0
    return Trees(feature, threshold, paths, right_turns, leaf_value, 0.0)


def _walk(
    tree: Mapping[str, Any],
) -> tuple[list[tuple[int, float]], list[tuple[float, list[tuple[int, bool]]]]]:
    """Internal nodes (feature, threshold) and leaves (value, [(node, turns right)])."""
    nodes: list[tuple[int, float]] = []
    leaves: list[tuple[float, list[tuple[int, bool]]]] = []

    def visit(node: Mapping[str, Any], way: list[tuple[int, bool]]) -> None:
        if "leaf_value" in node:
            leaves.append((float(node["leaf_value"]), way))
            return
        if node.get("decision_type", "<=") != "<=":
            raise ValueError(f"unsupported split {node.get('decision_type')!r}")
        index = len(nodes)
        nodes.append((int(node["split_feature"]), float(node["threshold"])))
        visit(node["left_child"], [*way, (index, False)])
        visit(node["right_child"], [*way, (index, True)])

    visit(tree, [])
    return nodes, leaves


def raw_scores(trees: Trees, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """The ensemble's log-odds in numpy, by the same tensor arithmetic as the ONNX graph."""
    count, internal = trees.feature.shape
    gathered = features[:, trees.feature.reshape(-1)]
    right = (gathered > trees.threshold.reshape(-1)).astype(np.float32)
    right = right.reshape(len(features), count, internal).transpose(1, 0, 2)
    reached = (right @ trees.paths == trees.right_turns).astype(np.float32)
    total: npt.NDArray[np.float64] = (
        (reached @ trees.leaf_value).sum(axis=0)[:, 0].astype(np.float64)
    )
    return total + trees.base


def export_onnx(trees: Trees, width: int, name: str, metadata: dict[str, str]) -> bytes:
    """The ensemble as an ONNX model: "features" float32 [batch, width] → "score" [batch]."""
    count, internal = trees.feature.shape
    leaves = trees.paths.shape[2]
    arrays: dict[str, npt.NDArray[np.generic]] = {
        "tree.feature": trees.feature.reshape(-1),
        "tree.threshold": trees.threshold.reshape(-1),
        "tree.shape": np.array([-1, count, internal], np.int64),
        "tree.paths": trees.paths,
        "tree.right_turns": trees.right_turns,
        "tree.leaf_value": trees.leaf_value,
        "tree.sum_axes": np.array([0], np.int64),
        "tree.base": np.array([trees.base], np.float32),
        "score_shape": np.array([-1], np.int64),
        "pad_row": np.zeros((1, width), np.float32),
        "pad_start": np.array([0], np.int64),
        "pad_end": np.array([-1], np.int64),
    }
    initializers = [numpy_helper.from_array(array, key) for key, array in arrays.items()]
    node = helper.make_node
    nodes = [
        # One zero row more, sliced off at the end: ONNX Runtime's CPU kernels crash on batched
        # products of an empty batch (SIGFPE), so the graph never runs one.
        node("Concat", [INPUT_NAME, "pad_row"], ["padded"], axis=0),
        node("Gather", ["padded", "tree.feature"], ["gathered"], axis=1),
        node("Greater", ["gathered", "tree.threshold"], ["right_bool"]),
        node("Cast", ["right_bool"], ["right_flat"], to=TensorProto.FLOAT),
        node("Reshape", ["right_flat", "tree.shape"], ["right_bti"]),
        node("Transpose", ["right_bti"], ["right"], perm=[1, 0, 2]),
        node("MatMul", ["right", "tree.paths"], ["turns"]),
        node("Equal", ["turns", "tree.right_turns"], ["reached_bool"]),
        node("Cast", ["reached_bool"], ["reached"], to=TensorProto.FLOAT),
        node("MatMul", ["reached", "tree.leaf_value"], ["per_tree"]),
        node("ReduceSum", ["per_tree", "tree.sum_axes"], ["total"], keepdims=0),
        node("Add", ["total", "tree.base"], ["logit"]),
        node("Sigmoid", ["logit"], ["probability"]),
        node("Reshape", ["probability", "score_shape"], ["padded_score"]),
        node("Slice", ["padded_score", "pad_start", "pad_end"], [OUTPUT_NAME]),
    ]
    del leaves
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=initializers,
    )
    model: onnx.ModelProto = helper.make_model(graph)
    return finish_model(model, metadata)
