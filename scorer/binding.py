"""Bucketed I/O binding: the model runs on a few fixed batch shapes whose buffers are allocated
and bound once, then reused for every call.

A batch of n rows is copied into a host staging buffer sized for the largest bucket (pinned
memory when the session is on a GPU), padded with zero rows up to the smallest bucket that holds
it, copied into that bucket's input buffer on the session's device, and scored by one run of the
bucket's pre-bound session; the scores of the n real rows are copied out. A batch larger than
the largest bucket is scored in chunks of the largest bucket. Rows are independent in the model,
so padding never changes a real row's score. Fixed shapes at fixed addresses are what CUDA
graphs need: with graphs on, bucket i is captured once as graph i + 1 and replayed from then on.
"""

from __future__ import annotations

import bisect
import logging
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from scorer.pinned import pinned_zeros
from scorer.runtime import CPU

log = logging.getLogger(__name__)

#: ONNX Runtime's run option naming the CUDA graph a run captures or replays; 0 is reserved.
_GRAPH_ID_OPTION = "gpu_graph_id"


def bucket_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The padded batch shapes: powers of two below `max_batch_size`, then `max_batch_size`
    itself (256 → 1, 2, 4, …, 256; 100 → 1, 2, …, 64, 100). At most half of a run is padding."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    smaller = (1 << exponent for exponent in range((max_batch_size - 1).bit_length()))
    return (*smaller, max_batch_size)


class _Bucket(NamedTuple):
    size: int
    inputs: ort.OrtValue
    outputs: ort.OrtValue
    binding: ort.IOBinding
    run_options: ort.RunOptions | None


class BucketRunner:
    """Scores batches of any size through pre-allocated, pre-bound buffers of the bucket sizes.

    One caller at a time: the buffers are shared between calls.
    """

    def __init__(
        self,
        session: ort.InferenceSession,
        sizes: tuple[int, ...],
        *,
        device_id: int,
        cuda_graphs: bool,
    ) -> None:
        self._session = session
        self.sizes = sizes
        on_gpu = session.get_providers()[0] != CPU
        (model_input,) = session.get_inputs()
        (model_output,) = session.get_outputs()
        width = int(model_input.shape[-1])
        output_tail = [int(dim) for dim in model_output.shape[1:]]
        staging_shape = (sizes[-1], width)
        pinned = pinned_zeros(staging_shape, device_id) if on_gpu else None
        self._staging = pinned if pinned is not None else np.zeros(staging_shape, np.float32)
        device = "cuda" if on_gpu else "cpu"
        self._buckets: list[_Bucket] = []
        for index, size in enumerate(sizes):
            inputs = ort.OrtValue.ortvalue_from_shape_and_type(
                [size, width], np.float32, device, device_id
            )
            outputs = ort.OrtValue.ortvalue_from_shape_and_type(
                [size, *output_tail], np.float32, device, device_id
            )
            binding = session.io_binding()
            binding.bind_ortvalue_input(model_input.name, inputs)
            binding.bind_ortvalue_output(model_output.name, outputs)
            run_options = None
            if cuda_graphs:
                run_options = ort.RunOptions()
                run_options.add_run_config_entry(_GRAPH_ID_OPTION, str(index + 1))
            self._buckets.append(_Bucket(size, inputs, outputs, binding, run_options))

    def run(self, features: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The model's scores of `features` [B, F], one per row, for any B."""
        largest = self.sizes[-1]
        if len(features) <= largest:
            return self._run_bucket(features)
        return np.concatenate(
            [
                self._run_bucket(features[start : start + largest])
                for start in range(0, len(features), largest)
            ]
        )

    def _run_bucket(self, rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        count = len(rows)
        bucket = self._buckets[bisect.bisect_left(self.sizes, count)]
        staged = self._staging[: bucket.size]
        staged[:count] = rows
        # Rows of an earlier batch must never reach the model (one that made it fail would fail
        # this batch too); zero rows are the known-good canary of poison isolation.
        staged[count:] = 0.0
        bucket.inputs.update_inplace(staged)
        # The copy above is not ordered with ONNX Runtime's own CUDA stream; this waits for it.
        bucket.binding.synchronize_inputs()
        self._session.run_with_iobinding(bucket.binding, bucket.run_options)
        # On the CPU numpy() is a view of the reused output buffer, so the scores are copied out.
        return np.array(bucket.outputs.numpy().reshape(-1)[:count], np.float32)
