"""`fraud-model inspect`: a model package's card (what it reads, what it outputs, its
thresholds, training and drift reference) and whether its graph fits its manifest, as plain
data (`describe`) and as text (`render_text`)."""

from __future__ import annotations

from typing import Any

import onnxruntime as ort

from plumbing.errors import ConfigurationError
from scorer.catalogue import BY_NAME
from scorer.model_package import (
    CARD_FILE,
    ModelPackage,
)
from scorer.runtime import ORT_ERRORS

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3

#: A metadata value longer than this is cut in the text card (--json has it whole).
_METADATA_CHARS = 100


def describe(package: ModelPackage) -> dict[str, Any]:
    """A package's card as plain data; its graph opened on ONNX Runtime's CPU provider."""
    manifest = package.manifest
    try:
        session = ort.InferenceSession(package.onnx, providers=["CPUExecutionProvider"])
    except ORT_ERRORS as exc:
        raise ConfigurationError(
            f"model package {str(package.path)!r}: ONNX Runtime cannot open its graph: "
            + " ".join(str(exc).split())
        ) from exc
    inputs = [_tensor(arg) for arg in session.get_inputs()]
    outputs = [_tensor(arg) for arg in session.get_outputs()]
    meta = session.get_modelmeta()
    return {
        "name": manifest.model.name,
        "version": manifest.model.version,
        "path": str(package.path),
        "sha256": manifest.onnx_sha256,
        "graph": {
            "inputs": inputs,
            "outputs": outputs,
            "agrees": not (problems := _graph_problems(inputs, outputs, len(manifest.features))),
            "problems": problems,
            "producer": meta.producer_name,
            "metadata": dict(meta.custom_metadata_map),
        },
        "features": [
            {"name": name, "description": BY_NAME[name].description} for name in manifest.features
        ],
        "output": {"meaning": manifest.output.meaning, "calibration": manifest.output.calibration},
        "thresholds": {
            "review": manifest.thresholds.review,
            "decline": manifest.thresholds.decline,
            "chosen_by": manifest.thresholds.chosen_by,
        },
        "training": {
            "data": manifest.training.data,
            "window": manifest.training.window,
            "metrics": manifest.training.metrics,
        },
        "reference": manifest.reference,
        "model_card": (package.path / CARD_FILE).is_file(),
    }


def _tensor(arg: Any) -> dict[str, Any]:
    return {"name": arg.name, "type": arg.type, "shape": list(arg.shape)}


def _graph_problems(
    inputs: list[dict[str, Any]], outputs: list[dict[str, Any]], n_features: int
) -> list[str]:
    """What keeps the service from scoring with this graph (OnnxScorer checks the same)."""
    problems = []
    if len(inputs) != 1:
        problems.append(f"the graph has {len(inputs)} inputs, the service feeds one")
    elif inputs[0]["type"] != "tensor(float)" or inputs[0]["shape"][-1:] != [n_features]:
        problems.append(
            f"the input is {inputs[0]['type']} {inputs[0]['shape']}, the manifest names "
            f"{n_features} features: float32 [batch, {n_features}] is needed"
        )
    if len(outputs) != 1:
        problems.append(f"the graph has {len(outputs)} outputs, the service reads one score")
    elif outputs[0]["type"] != "tensor(float)" or outputs[0]["shape"][1:] not in ([], [1]):
        problems.append(
            f"the output is {outputs[0]['type']} {outputs[0]['shape']}: float32 [batch] or "
            "[batch, 1] is needed"
        )
    return problems


def render_text(card: dict[str, Any]) -> str:
    """The card for a person."""
    graph = card["graph"]

    def tensors(items: list[dict[str, Any]]) -> str:
        return ", ".join(f"{t['name']} {t['type']} {t['shape']}" for t in items)

    lines = [
        f"model        {card['name']} {card['version']}",
        f"path         {card['path']}",
        f"sha256       {card['sha256']}",
        f"input        {tensors(graph['inputs'])}",
        f"output       {tensors(graph['outputs'])}",
        "graph        "
        + (
            "fits the manifest"
            if graph["agrees"]
            else "DOES NOT FIT: " + "; ".join(graph["problems"])
        ),
        f"producer     {graph['producer'] or 'not recorded'}",
        *(
            f"{'metadata' if i == 0 else '':<12} {key} = {_shorten(value)}"
            for i, (key, value) in enumerate(sorted(graph["metadata"].items()))
        ),
        f"score        {card['output']['meaning']}",
        f"calibration  {card['output']['calibration']}",
        f"thresholds   review {card['thresholds']['review']:g}, decline "
        f"{card['thresholds']['decline']:g}; chosen by: {card['thresholds']['chosen_by']}",
        f"trained on   {card['training']['data']}",
        f"window       {card['training']['window']}",
        "metrics      "
        + (
            ", ".join(f"{k} {v:g}" for k, v in card["training"]["metrics"].items())
            or "none recorded"
        ),
        "reference    "
        + (
            f"present ({len(card['reference'])} values): reason codes on"
            if card["reference"]
            else "absent: reason codes off"
        ),
        f"model card   {CARD_FILE} " + ("present" if card["model_card"] else "absent"),
        f"features     {len(card['features'])} (input column, name, meaning)",
    ]
    width = max(len(f["name"]) for f in card["features"])
    lines += [
        f"  {i:>3}  {f['name']:<{width}}  {f['description']}"
        for i, f in enumerate(card["features"])
    ]
    return "\n".join(lines)


def _shorten(text: str) -> str:
    return text if len(text) <= _METADATA_CHARS else text[:_METADATA_CHARS] + "…"
