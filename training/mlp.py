"""A small multi-layer perceptron in plain numpy, exported as Gemm/Relu/Sigmoid ONNX.

Inputs are standardised with the training split's mean and spread, folded into the first layer
on export, so the service feeds raw `build_features` rows. Mini-batch Adam on fraud-weighted
binary cross-entropy; deterministic for a given random generator.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from training.onnx_export import INPUT_NAME, OUTPUT_NAME, finish_model

logger = logging.getLogger(__name__)

HIDDEN_SIZES: tuple[int, ...] = (64, 32)
EPOCHS = 25
BATCH_SIZE = 512
LEARNING_RATE = 2e-3
ADAM_BETA1, ADAM_BETA2, ADAM_EPSILON = 0.9, 0.999, 1e-8
#: Loss weight of a fraud relative to a legitimate transaction.
FRAUD_WEIGHT = 3.0
#: Features with no spread in the training split are left unscaled (no division by ~0).
_MIN_FEATURE_STD = 1e-3

_Floats = npt.NDArray[np.float64]


class Layer(NamedTuple):
    """One fully connected layer: outputs = inputs @ weights + bias."""

    weights: _Floats  # [inputs, outputs]
    bias: _Floats  # [outputs]


def fit(
    features: npt.NDArray[np.float32], is_fraud: npt.NDArray[np.bool_], rng: np.random.Generator
) -> list[Layer]:
    """Train on raw feature rows; the returned layers take raw rows (standardisation folded)."""
    raw = features.astype(np.float64)
    mean = raw.mean(axis=0)
    std = raw.std(axis=0)
    std = np.where(std < _MIN_FEATURE_STD, 1.0, std)
    layers = _fit((raw - mean) / std, is_fraud, rng)
    return _fold_standardisation(layers, mean, std)


def raw_scores(layers: Sequence[Layer], features: npt.NDArray[np.float32]) -> _Floats:
    """The network's logits in numpy."""
    x = features.astype(np.float64)
    for layer in layers[:-1]:
        x = np.maximum(x @ layer.weights + layer.bias, 0.0)
    result: _Floats = (x @ layers[-1].weights + layers[-1].bias)[:, 0]
    return result


def _sigmoid(x: _Floats) -> _Floats:
    # Written through tanh, which cannot overflow for large |x| as exp(-x) can.
    result: _Floats = 0.5 * (1.0 + np.tanh(0.5 * x))
    return result


def _initial_layers(rng: np.random.Generator, width: int) -> list[Layer]:
    sizes = (width, *HIDDEN_SIZES, 1)
    return [
        # He initialisation suits ReLU layers.
        Layer(rng.normal(0.0, math.sqrt(2.0 / fan_in), (fan_in, fan_out)), np.zeros(fan_out))
        for fan_in, fan_out in itertools.pairwise(sizes)
    ]


def _fit(
    features: _Floats, is_fraud: npt.NDArray[np.bool_], rng: np.random.Generator
) -> list[Layer]:
    """Mini-batch Adam on fraud-weighted binary cross-entropy over standardised features."""
    layers = _initial_layers(rng, features.shape[1])
    params = [array for layer in layers for array in layer]
    first_moment = [np.zeros_like(p) for p in params]
    second_moment = [np.zeros_like(p) for p in params]
    target = is_fraud.astype(np.float64)
    weight = np.where(is_fraud, FRAUD_WEIGHT, 1.0)
    step = 0
    for epoch in range(EPOCHS):
        order = rng.permutation(len(features))
        loss_sum = weight_sum = 0.0
        for start in range(0, len(order), BATCH_SIZE):
            rows = order[start : start + BATCH_SIZE]
            x, y, w = features[rows], target[rows], weight[rows]
            activations = [x]
            for layer in layers[:-1]:
                activations.append(np.maximum(activations[-1] @ layer.weights + layer.bias, 0.0))
            logit = (activations[-1] @ layers[-1].weights + layers[-1].bias)[:, 0]
            probability = _sigmoid(logit)
            # Cross-entropy from logits: log(1 + e^z) - y z, stable for any z.
            loss = np.logaddexp(0.0, logit) - y * logit
            loss_sum += float((w * loss).sum())
            weight_sum += float(w.sum())
            upstream = ((probability - y) * w / w.sum())[:, None]
            grads: list[_Floats] = []
            for index in range(len(layers) - 1, -1, -1):
                grads[:0] = [activations[index].T @ upstream, upstream.sum(axis=0)]
                if index:
                    upstream = (upstream @ layers[index].weights.T) * (activations[index] > 0.0)
            step += 1
            correction1 = 1.0 - ADAM_BETA1**step
            correction2 = 1.0 - ADAM_BETA2**step
            for param, grad, m, v in zip(params, grads, first_moment, second_moment, strict=True):
                m *= ADAM_BETA1
                m += (1.0 - ADAM_BETA1) * grad
                v *= ADAM_BETA2
                v += (1.0 - ADAM_BETA2) * grad * grad
                param -= (
                    LEARNING_RATE * (m / correction1) / (np.sqrt(v / correction2) + ADAM_EPSILON)
                )
        logger.info("epoch=%d weighted_loss=%.5f", epoch + 1, loss_sum / weight_sum)
    return layers


def _fold_standardisation(layers: list[Layer], mean: _Floats, std: _Floats) -> list[Layer]:
    """The same network taking raw features: (x - mean) / std folded into the first layer."""
    first = layers[0]
    weights = first.weights / std[:, None]
    bias = first.bias - mean @ weights
    return [Layer(weights, bias), *layers[1:]]


def export_onnx(layers: Sequence[Layer], width: int, name: str, metadata: dict[str, str]) -> bytes:
    """Serialize the network as an ONNX model: "features" float32 [batch, F] → "score" [batch]."""
    initializers: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    current = INPUT_NAME
    for index, layer in enumerate(layers):
        weights, bias = f"layer{index}.weights", f"layer{index}.bias"
        initializers.append(numpy_helper.from_array(layer.weights.astype(np.float32), weights))
        initializers.append(numpy_helper.from_array(layer.bias.astype(np.float32), bias))
        linear = f"layer{index}.linear"
        nodes.append(helper.make_node("Gemm", [current, weights, bias], [linear]))
        if index < len(layers) - 1:
            current = f"layer{index}.relu"
            nodes.append(helper.make_node("Relu", [linear], [current]))
        else:
            current = linear
    initializers.append(numpy_helper.from_array(np.array([-1], np.int64), "score_shape"))
    nodes.append(helper.make_node("Sigmoid", [current], ["probability"]))
    nodes.append(helper.make_node("Reshape", ["probability", "score_shape"], [OUTPUT_NAME]))
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=initializers,
    )
    model: onnx.ModelProto = helper.make_model(graph)
    return finish_model(model, metadata)
