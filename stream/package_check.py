"""The check a model package passes before a replica opens its graph: in a child process,
bounded in memory and in time.

A package is input from outside (whoever can write its directory or publish to the registry),
and opening its graph runs what the graph says: it may make tensors of any size (a
`ConstantOfShape` of 16 GiB) or loop for as long as it likes (a `Loop` with a huge trip count).
So a package is first loaded, warmed up at every batch shape and sanity-scored (`sanity_check`)
by a child process (`python -m stream.package_check`), on the CPU, under three bounds:

- its graph's working tensors come from one ONNX Runtime arena capped at
  `FRAUD_MODEL_MAX_MEMORY_MB`: a tensor past it fails with ONNX Runtime's error;
- its address space (RLIMIT_AS) is its size once its modules are imported and the typical rows
  computed, plus that cap, plus room for the graph's weights (`WEIGHT_COPIES` times the graph's
  file) and for ONNX Runtime's own allocations (`HEADROOM_BYTES`): whatever the arena does not
  see fails to allocate instead of taking the host's memory;
- `FRAUD_MODEL_CHECK_TIMEOUT_S` of wall-clock time, past which it is killed, and as much CPU
  time (RLIMIT_CPU), past which the kernel ends it should the replica be gone.

Whatever the child cannot do in those bounds (an error, a crash, a kill) refuses the package
with one line; its memory goes with the child, so the replica keeps none of it. Only a package
the child passed is opened in the replica, which then scores the same rows again on its own
device (`stream/model_reload.py` `load_checked_model`): a sound package gets the same verdict
twice. The child answers with a digest of the manifest it checked, and the replica opens the
package only when the one it read itself has the same (the graph's sha256 is in the manifest);
files rewritten in between are read again at the next poll.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
import numpy.typing as npt

from plumbing.errors import ConfigurationError, ModelSourceUnavailableError
from scorer.features import NUM_FEATURES
from scorer.isolation import score_rows
from scorer.model import OnnxScorer
from scorer.model_package import MAX_ONNX_BYTES, ONNX_FILE, Manifest, load_model_package
from stream.typical_rows import typical_rows

log = logging.getLogger(__name__)

#: The module the child runs.
MODULE = "stream.package_check"
#: FRAUD_MODEL_CHECK_TIMEOUT_S's default: a sound package's check takes a few seconds (the
#: child's start, about 1.5 s on a loaded 2-core machine, most of it); a minute leaves room for
#: a large graph on a busy host.
DEFAULT_TIMEOUT_S = 60.0
#: The graph's bytes are held by the child up to this many times beyond the cap: read, then
#: parsed and kept as initializers by ONNX Runtime.
WEIGHT_COPIES = 3
#: Room in the child's address space for what ONNX Runtime allocates outside its arena (the
#: session, its kernels and the optimised graph; about 2 MiB for the shipped model) and for
#: Python's own allocations while it checks.
HEADROOM_BYTES = 256 * 1024 * 1024
#: Exit statuses of the child: it passed the package, or refused it (its reason on stdout).
EXIT_PASSED, EXIT_REFUSED = 0, 2
#: The last bytes of the child's stderr quoted when it ends without an answer, and the most of
#: an error's first line quoted in a refusal (ONNX Runtime's run to many lines).
_STDERR_TAIL_BYTES = 600
_MAX_REASON_CHARS = 400
_MIB = 1024 * 1024


class CheckRequest(msgspec.Struct, frozen=True):
    """What the parent asks the child (JSON on its stdin)."""

    directory: str
    max_batch_size: int
    max_memory_mb: int
    #: The parent kills the child past this; the child's CPU time is limited to it too, so a
    #: child whose parent died ends by itself.
    timeout_s: float = DEFAULT_TIMEOUT_S
    #: Recent real rows the package must score too: float32 [n, NUM_FEATURES], row-major
    #: (none: empty).
    recent: bytes = b""


class CheckResult(msgspec.Struct, frozen=True):
    """The child's answer (JSON on its stdout): the digest of the manifest it passed, or why
    it refused the package."""

    manifest_sha256: str | None = None
    refused: str | None = None
    #: The child's RLIMIT_AS (None: /proc did not say its size, no limit was set).
    address_space_bytes: int | None = None
    #: The child's resident peak, when it answered.
    peak_rss_bytes: int | None = None


def manifest_digest(manifest: Manifest) -> str:
    """A digest of a manifest's every field (its graph's sha256 among them)."""
    return hashlib.sha256(msgspec.json.encode(manifest)).hexdigest()


def sanity_check(scorer: OnnxScorer, recent: npt.NDArray[np.float32] | None = None) -> None:
    """Score the package's reference row (zeros without one), the typical transactions
    (`stream/typical_rows.py`) and the `recent` real rows a model decided; ConfigurationError
    unless every score is a probability (one line: which rows, how many failed, the first
    failure)."""
    package = scorer.package
    row = np.zeros((1, NUM_FEATURES), np.float32)
    if package.reference is not None:
        row[0, package.feature_index] = package.reference
    checks = [
        ("its reference row" if package.reference is not None else "the all-zeros row", row),
        ("typical transactions", typical_rows()),
    ]
    if recent is not None:
        checks.append(("recent transactions", recent))
    for what, rows in checks:
        if not len(rows):
            continue
        scored = score_rows(scorer, rows)
        if scored.failures:
            raise ConfigurationError(
                f"model package {str(package.path)!r} fails {scored.failures} of the {len(rows)} "
                f"rows of {what}: {scored.why}: it would dead-letter such records; check the "
                "graph's output (docs/models.md)"
            ) from scored.cause


def check_package(
    directory: Path,
    *,
    max_batch_size: int,
    max_memory_mb: int,
    timeout_s: float,
    recent: npt.NDArray[np.float32] | None = None,
) -> str:
    """Load, warm up and sanity-score the package at `directory` in a child process, within
    `max_memory_mb` of working memory and `timeout_s`; the digest of the manifest it passed
    (`manifest_digest`). ConfigurationError (one line) when the child refuses the package,
    crashes or runs out of time; ModelSourceUnavailableError when no child can be started."""
    where = str(directory)
    request = CheckRequest(
        where,
        max_batch_size,
        max_memory_mb,
        timeout_s,
        b"" if recent is None else np.ascontiguousarray(recent, np.float32).tobytes(),
    )
    started = time.perf_counter()
    with tempfile.TemporaryFile() as stderr:
        try:
            child = subprocess.Popen(
                [sys.executable, "-m", MODULE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=_child_environment(),
            )
        except OSError as exc:
            raise ModelSourceUnavailableError(
                f"model package {where!r}: its check could not be started: {exc}"
            ) from exc
        try:
            answer, _ = child.communicate(msgspec.json.encode(request), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise ConfigurationError(
                f"model package {where!r} was not checked within {timeout_s:g} s "
                "(FRAUD_MODEL_CHECK_TIMEOUT_S; loading, warming up and scoring the typical "
                "rows): its graph runs too long to serve (docs/models.md)"
            ) from None
        stderr.seek(max(0, stderr.seek(0, os.SEEK_END) - _STDERR_TAIL_BYTES))
        tail = stderr.read().decode("utf-8", "replace").strip()
    try:
        result = msgspec.json.decode(answer, type=CheckResult)
    except msgspec.DecodeError:
        result = CheckResult()
    log.debug(
        "model package %s: its check's resident peak %s bytes",
        where,
        result.peak_rss_bytes,
        extra={"check_peak_rss_bytes": result.peak_rss_bytes},
    )
    if child.returncode == EXIT_PASSED and result.manifest_sha256 is not None:
        log.info(
            "model package %s passed its check in a child process in %.2f s (address space "
            "limit %s MiB)",
            where,
            time.perf_counter() - started,
            "none" if result.address_space_bytes is None else result.address_space_bytes >> 20,
        )
        return result.manifest_sha256
    if child.returncode == EXIT_REFUSED and result.refused is not None:
        raise ConfigurationError(result.refused)
    ended = (
        f"signal {signal.Signals(-child.returncode).name}"
        if child.returncode < 0
        else f"status {child.returncode}"
    )
    last = tail.splitlines()[-1] if tail else "nothing on stderr"
    raise ConfigurationError(
        f"model package {where!r}: its check ended with {ended} without an answer ({last}); "
        f"a graph that crashes ONNX Runtime or needs more than {max_memory_mb} MiB "
        "(FRAUD_MODEL_MAX_MEMORY_MB) cannot serve"
    )


def _child_environment() -> dict[str, str]:
    """The child's environment: the parent's, importing this checkout's packages, with one
    thread per pool (it checks one package; the replica's cores are for scoring)."""
    root = str(Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
    }


def address_space_limit(baseline_bytes: int, max_memory_mb: int, onnx_bytes: int) -> int:
    """The child's RLIMIT_AS: its size before it reads the package, plus the arena's cap, plus
    room for the graph's weights and ONNX Runtime's own allocations."""
    return baseline_bytes + max_memory_mb * _MIB + WEIGHT_COPIES * onnx_bytes + HEADROOM_BYTES


def _address_space_bytes() -> int | None:
    """This process's virtual size (VmSize), None where /proc does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_here(request: CheckRequest) -> str:
    """The child's work, in this process: load the package, open its graph on the CPU within
    the request's cap, warm it up and sanity-score it; its manifest's digest. Raises what the
    package provokes (ConfigurationError, ScoreError, anything ONNX Runtime raises)."""
    package = load_model_package(Path(request.directory))
    scorer = OnnxScorer(
        package,
        "cpu",
        cpu_threads=1,
        max_batch_size=request.max_batch_size,
        cpu_memory_cap=request.max_memory_mb * _MIB,
    )
    scorer.warm_up()
    recent = np.frombuffer(request.recent, np.float32).reshape(-1, NUM_FEATURES)
    sanity_check(scorer, recent)
    return manifest_digest(package.manifest)


def main() -> int:
    """`python -m stream.package_check`: the child. Reads a CheckRequest on stdin, answers a
    CheckResult on stdout."""
    request = msgspec.json.decode(sys.stdin.buffer.read(), type=CheckRequest)
    cpu_s = math.ceil(request.timeout_s) + 1  # SIGXCPU ends it; SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    typical_rows()  # computed before the limit: they are the replica's, not the package's
    baseline, limit = _address_space_bytes(), None
    if baseline is not None:
        try:
            onnx_bytes = min(os.stat(Path(request.directory) / ONNX_FILE).st_size, MAX_ONNX_BYTES)
        except OSError:
            onnx_bytes = 0  # load_model_package says why
        limit = address_space_limit(baseline, request.max_memory_mb, onnx_bytes)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        result = CheckResult(manifest_sha256=check_here(request), address_space_bytes=limit)
    except MemoryError:
        result = CheckResult(
            refused=f"model package {request.directory!r} needs more memory than its check "
            f"allows ({request.max_memory_mb} MiB of working memory, FRAUD_MODEL_MAX_MEMORY_MB, "
            "and its weights)"
        )
    except ConfigurationError as exc:  # says what to fix (and, mostly, which package)
        text = str(exc)
        where = f"model package {request.directory!r}"
        result = CheckResult(refused=text if request.directory in text else f"{where}: {text}")
    except Exception as exc:  # whatever else the graph provokes (its warm-up fails) refuses it
        first = (str(exc).strip().splitlines() or [""])[0][:_MAX_REASON_CHARS]
        result = CheckResult(
            refused=f"model package {request.directory!r} fails its warm-up: "
            f"{type(exc).__name__}: {first}"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: in KiB
    sys.stdout.buffer.write(
        msgspec.json.encode(msgspec.structs.replace(result, peak_rss_bytes=peak))
    )
    sys.stdout.flush()
    return EXIT_PASSED if result.manifest_sha256 is not None else EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
