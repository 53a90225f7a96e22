"""What every exported model shares: input and output names, opset, metadata, the checks."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnx import helper

OPSET = 17
#: ONNX 1.12 released opset 17 with IR version 8; the onnxruntime versions we support load it.
IR_VERSION = 8
INPUT_NAME = "features"
OUTPUT_NAME = "score"
PRODUCER = "training.train"


def finish_model(model: onnx.ModelProto, metadata: dict[str, str]) -> bytes:
    """Set the opset, IR version and metadata, check the model and serialize it."""
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", OPSET))
    model.ir_version = IR_VERSION
    model.producer_name = PRODUCER
    model.doc_string = "Fraud probability of a card transaction from its build_features row."
    helper.set_model_props(model, metadata)
    onnx.checker.check_model(model, full_check=True)
    serialized: bytes = model.SerializeToString()
    return serialized


def score_with_onnxruntime(
    model: bytes, features: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Scores of a serialized model for a feature matrix, on ONNX Runtime's CPU provider."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    scores: npt.NDArray[np.float32] = session.run([OUTPUT_NAME], {INPUT_NAME: features})[0]
    return scores
