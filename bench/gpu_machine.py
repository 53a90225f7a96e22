"""What `bench/gpu_bench.py` records about the machine it runs on: the GPU's utilisation and
memory while it is saturated (nvidia-smi), the hardware and the software versions."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

#: How often nvidia-smi samples utilisation and memory.
SAMPLE_INTERVAL_MS = 200


class GpuSampler:
    """nvidia-smi printing utilisation (%) and memory used (MiB) every SAMPLE_INTERVAL_MS."""

    def __init__(self, device_id: int) -> None:
        self._process = subprocess.Popen(
            [
                "nvidia-smi",
                f"--id={device_id}",
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
                f"--loop-ms={SAMPLE_INTERVAL_MS}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> list[tuple[float, float]]:
        self._process.terminate()
        output, _ = self._process.communicate()
        samples = []
        for line in output.splitlines():
            fields = [field.strip() for field in line.split(",")]
            if len(fields) == 2 and all(re.fullmatch(r"\d+(\.\d+)?", f) for f in fields):
                samples.append((float(fields[0]), float(fields[1])))
        return samples


def process_gpu_memory_mib() -> float | None:
    """GPU memory this process holds, from nvidia-smi's list of compute processes."""
    output = run_text(
        "nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"
    )
    for line in (output or "").splitlines():
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()):
            return float(used)
    return None


def describe_hardware(device_id: int) -> dict[str, Any]:
    smi = run_text("nvidia-smi")
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi or "")
    gpu = run_text(
        "nvidia-smi",
        f"--id={device_id}",
        "--query-gpu=name,driver_version,memory.total,pci.bus_id",
        "--format=csv,noheader",
    )
    return {
        "gpus": (run_text("nvidia-smi", "-L") or "").splitlines(),
        "gpu_measured": gpu.strip() if gpu else None,
        "driver_cuda_version": cuda.group(1) if cuda else None,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
    }


def describe_software() -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "onnxruntime": ort.__version__,
        "onnxruntime_cuda_build": getattr(ort, "cuda_version", None),
        "onnxruntime_providers": ort.get_available_providers(),
        "numpy": np.__version__,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_text(*command: str) -> str | None:
    """A command's standard output, or None when it is missing or fails."""
    if shutil.which(command[0]) is None:
        return None
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    return result.stdout if result.returncode == 0 else None
