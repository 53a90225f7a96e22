"""Page-locked ("pinned") host memory from the CUDA runtime, for host → GPU copies.

A copy from pinned memory is one direct DMA transfer that is complete when `cudaMemcpy` returns;
from ordinary (pageable) memory the driver first stages the data through a pinned bounce buffer.
ONNX Runtime's Python API cannot allocate pinned memory itself, so it comes from the CUDA
runtime library that ONNX Runtime's CUDA provider has already loaded into the process.
"""

from __future__ import annotations

import ctypes
import logging
import weakref

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

log = logging.getLogger(__name__)

#: cudaHostAllocPortable: pinned for every CUDA context, whichever device is current.
_HOST_ALLOC_PORTABLE = 1
_CUDA_SUCCESS = 0


def pinned_zeros(shape: tuple[int, ...], device_id: int) -> npt.NDArray[np.float32] | None:
    """A zero-filled float32 array in pinned host memory, allocated from GPU `device_id`'s
    context and freed when the last view of it is gone; None when the CUDA runtime is not
    loadable or refuses the allocation."""
    try:
        cudart = ctypes.CDLL(f"libcudart.so.{str(ort.cuda_version).split('.')[0]}")
    except OSError as exc:
        log.warning("no CUDA runtime for pinned host memory (%s); using pageable memory", exc)
        return None
    cudart.cudaSetDevice.argtypes = [ctypes.c_int]
    cudart.cudaSetDevice.restype = ctypes.c_int
    cudart.cudaHostAlloc.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_size_t,
        ctypes.c_uint,
    ]
    cudart.cudaHostAlloc.restype = ctypes.c_int
    cudart.cudaFreeHost.argtypes = [ctypes.c_void_p]
    cudart.cudaFreeHost.restype = ctypes.c_int
    nbytes = int(np.prod(shape)) * np.dtype(np.float32).itemsize
    pointer = ctypes.c_void_p()
    # Without this the allocation would create a context on GPU 0 whichever GPU scores.
    status = cudart.cudaSetDevice(device_id)
    if status == _CUDA_SUCCESS:
        status = cudart.cudaHostAlloc(ctypes.byref(pointer), nbytes, _HOST_ALLOC_PORTABLE)
    if status != _CUDA_SUCCESS or pointer.value is None:
        log.warning("no pinned host memory (CUDA error %s); using pageable memory", status)
        return None
    block = (ctypes.c_byte * nbytes).from_address(pointer.value)
    # Every numpy view keeps `block` alive, so the memory is freed only after the last view.
    weakref.finalize(block, cudart.cudaFreeHost, pointer.value)
    array = np.frombuffer(memoryview(block), np.float32).reshape(shape)
    array.fill(0.0)
    return array
