"""The model package as an input surface (docs/threat-model.md): hostile `model.toml` and
`model.onnx` files, driven through the path a replica reads a package on (`load_model_package`,
then the check a child process runs before the replica opens a graph: `check_package`, the
graph opened within the cap and the child's address-space limit, warmed up and sanity-scored),
are each loaded or refused with ConfigurationError, never a crash, and stay within a stated
budget of memory and time, the replica's and the child's. A graph costs a child's start (about
1.5 s), so the graphs are fewer than the manifests.

Memory is Python's peak allocation (tracemalloc, `tests.support.budget`) and, for the graph,
the process's native peak too (ONNX Runtime allocates outside Python's view): the high-water
mark of its resident memory, reset before each example where the kernel allows it.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from plumbing.errors import ConfigurationError
from scorer.features import FEATURE_NAMES, NUM_FEATURES
from scorer.model_package import (
    MANIFEST_FILE,
    MAX_MANIFEST_BYTES,
    MAX_ONNX_BYTES,
    ONNX_FILE,
    ModelPackage,
    load_model_package,
    manifest_toml,
    plain_manifest,
    sha256_hex,
)
from stream.package_check import check_package, manifest_digest
from stream.startup.config import SHIPPED_MODEL_PATH
from tests.support.budget import MIB, Budget, within
from tests.support.models import onnx_model

#: A manifest is at most MAX_MANIFEST_BYTES: parsing and checking one costs little.
MANIFEST_BUDGET = Budget(peak_bytes=16 * MIB, seconds=5.0)
#: A graph is opened, warmed up and sanity-scored by a child process within the cap on its
#: working memory (`CAP_MB` here) and its address-space limit; the replica reads the files
#: (Python holds the graph twice at most) and opens none of it.
CAP_MB = 64
ONNX_BUDGET = Budget(peak_bytes=32 * MIB, seconds=20.0)
NATIVE_BUDGET_BYTES = 384 * MIB
#: The child's resident peak: its size once started (about 200 MB resident) and the cap, within
#: its address space (about 750 MB at this cap).
CHILD_BUDGET_BYTES = 1024 * MIB

SHIPPED_TOML = (SHIPPED_MODEL_PATH / MANIFEST_FILE).read_text(encoding="utf-8")
SHIPPED_ONNX = (SHIPPED_MODEL_PATH / ONNX_FILE).read_bytes()
SHIPPED = tomllib.loads(SHIPPED_TOML)


# --- the manifest -------------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def toml_document(document: dict[str, Any]) -> str:
    """A TOML document whose every top-level key is one line (tables inline)."""
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in document.items())


scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
)
hostile_values = st.one_of(
    scalars,
    st.text(min_size=1_000, max_size=20_000),  # long strings
    st.lists(scalars, min_size=100, max_size=2_000),  # long arrays
    st.lists(st.sampled_from(FEATURE_NAMES), max_size=200),  # duplicates, order
    st.lists(st.text(min_size=1, max_size=30), max_size=50),  # names not in the catalogue
    st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=60),  # nesting
    st.dictionaries(st.text(max_size=10), scalars, max_size=20),  # wrong shape
    st.floats(min_value=-1e9, max_value=1e9),  # thresholds out of range
)
paths = st.sampled_from(
    [
        ("format",),
        ("features",),
        ("reference",),
        ("onnx_sha256",),
        ("model", "name"),
        ("model", "version"),
        ("output", "calibration"),
        ("thresholds", "review"),
        ("thresholds", "decline"),
        ("training", "metrics"),
        ("drift",),
        ("drift", "score"),
        ("extra",),
    ]
)


@st.composite
def manifests(draw: st.DrawFn) -> bytes:
    """The shipped manifest with one to three fields made hostile, or text that is barely
    TOML (deep nesting, dotted keys, random bytes)."""
    kind = draw(st.sampled_from(["fields", "fields", "nesting", "dotted", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=4_096))
    if kind == "nesting":
        depth = draw(st.integers(min_value=10, max_value=5_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ("{a=", "}")]))
        return (SHIPPED_TOML + f"\nx = {opener * depth}1{closer * depth}\n").encode()
    if kind == "dotted":
        depth = draw(st.integers(min_value=10, max_value=8_000))
        return (SHIPPED_TOML + "\n[" + ".".join(["k"] * depth) + "]\n").encode()
    document = json.loads(json.dumps(SHIPPED))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(paths)
        where = document
        for key in path[:-1]:
            if not isinstance(where.get(key), dict):
                where[key] = {}
            where = where[key]
        where[path[-1]] = draw(hostile_values)
    return toml_document(document).encode("utf-8", "surrogatepass")


@contextmanager
def package_dir(tmp: Path, manifest: bytes, onnx: bytes = SHIPPED_ONNX) -> Iterator[Path]:
    directory = tmp / "package"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    (directory / MANIFEST_FILE).write_bytes(manifest)
    (directory / ONNX_FILE).write_bytes(onnx)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(manifest=manifests())
@example(manifest=SHIPPED_TOML.encode())  # used
@example(manifest=(SHIPPED_TOML + "x = " + "[" * 100_000).encode()[:MAX_MANIFEST_BYTES])
def test_a_hostile_manifest_is_loaded_or_refused_within_budget(
    manifest: bytes, tmp_path: Path
) -> None:
    with package_dir(tmp_path, manifest) as directory:
        loaded: ModelPackage | None = None
        with within(MANIFEST_BUDGET, "the manifest"):
            try:
                loaded = load_model_package(directory)
            except ConfigurationError as exc:
                assert "\n" not in str(exc) and str(exc).startswith("model package")
        if loaded is not None:  # used: every check held
            assert set(loaded.manifest.features) <= set(FEATURE_NAMES)
            assert 0.0 <= loaded.thresholds.review <= loaded.thresholds.decline <= 1.0


def test_the_manifest_is_bounded_before_it_is_parsed(tmp_path: Path) -> None:
    """A manifest past MAX_MANIFEST_BYTES is refused from its size, unread."""
    padding = "# " + "x" * 78 + "\n"
    huge = SHIPPED_TOML + padding * (MAX_MANIFEST_BYTES // len(padding) + 1)
    with (
        package_dir(tmp_path, huge.encode()) as directory,
        within(Budget(MIB, 1.0), "an oversized manifest"),
        pytest.raises(ConfigurationError, match="larger than"),
    ):
        load_model_package(directory)


def test_a_graph_file_past_its_bound_is_refused_unread(tmp_path: Path) -> None:
    """A sparse model.onnx declaring 2 GiB: refused from its size, nothing read."""
    with package_dir(tmp_path, SHIPPED_TOML.encode()) as directory:
        with (directory / ONNX_FILE).open("r+b") as graph:
            graph.truncate(MAX_ONNX_BYTES + 1)
        with (
            within(Budget(MIB, 1.0), "an oversized graph"),
            pytest.raises(ConfigurationError, match="larger than"),
        ):
            load_model_package(directory)


# --- the graph ----------------------------------------------------------------------------------


def _graph(nodes: list[Any], initializers: list[TensorProto]) -> bytes:
    graph = helper.make_graph(
        nodes,
        "hostile",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", NUM_FEATURES])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch"])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def declared_initializer(dims: list[int]) -> bytes:
    """A graph whose initializer declares `dims` and holds 16 bytes."""
    tensor = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=dims, raw_data=b"\0" * 16)
    return _graph(
        [
            helper.make_node("ReduceMax", ["features"], ["m"], axes=[1], keepdims=0),
            helper.make_node("ReduceSum", ["big"], ["b"], keepdims=0),
            helper.make_node("Add", ["m", "b"], ["s"]),
            helper.make_node("Sigmoid", ["s"], ["score"]),
        ],
        [tensor],
    )


def allocating(shape: list[int]) -> bytes:
    """A graph that makes a tensor of `shape` at every run (ConstantOfShape), folded into its
    scores: a valid model whose working memory its graph declares."""
    return onnx_model(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["c"]),
            helper.make_node("ReduceSum", ["c"], ["cs"], keepdims=0),
            helper.make_node("ReduceMax", ["features"], ["m"], axes=[1], keepdims=0),
            helper.make_node("Add", ["m", "cs"], ["s"]),
            helper.make_node("Sigmoid", ["s"], ["score"]),
        ],
        {"shape": np.array(shape, np.int64)},
        ["batch"],
    )


def shipped_manifest(graph: bytes) -> str:
    """The shipped package's manifest, for `graph`: a spoiled copy of the shipped graph."""
    return SHIPPED_TOML.replace(SHIPPED["onnx_sha256"], sha256_hex(graph))


def plain_manifest_for(graph: bytes) -> str:
    """A manifest naming every catalogue column, for a graph made here."""
    return manifest_toml(
        msgspec.structs.replace(plain_manifest("hostile", "1"), onnx_sha256=sha256_hex(graph))
    )


@st.composite
def graphs(draw: st.DrawFn) -> tuple[bytes, str]:
    """A hostile model.onnx, and the manifest of a package that is whole but for it."""
    kind = draw(st.sampled_from(["random", "truncated", "flipped", "declared", "allocating"]))
    if kind == "random":
        graph = draw(st.binary(max_size=8_192))
        return graph, plain_manifest_for(graph)
    if kind == "truncated":
        graph = SHIPPED_ONNX[: draw(st.integers(min_value=0, max_value=len(SHIPPED_ONNX) - 1))]
        return graph, shipped_manifest(graph)
    if kind == "flipped":
        flipped = bytearray(SHIPPED_ONNX)
        for at in draw(st.lists(st.integers(0, len(flipped) - 1), min_size=1, max_size=8)):
            flipped[at] ^= draw(st.integers(1, 255))
        return bytes(flipped), shipped_manifest(bytes(flipped))
    if kind == "declared":
        dims = draw(st.lists(st.integers(min_value=1, max_value=2**31), min_size=1, max_size=4))
        graph = declared_initializer(dims)
        return graph, plain_manifest_for(graph)
    # Up to 16 GiB a run: within the cap it serves, past it it is refused.
    side = draw(st.sampled_from([1, 64, 1_024, 8_192, 65_536]))
    graph = allocating([side, draw(st.sampled_from([1, 16, 65_536]))])
    return graph, plain_manifest_for(graph)


@contextmanager
def native_peak(limit_bytes: int) -> Iterator[None]:
    """Fail when the process's resident high-water mark grows by more than `limit_bytes`
    (checked only where the kernel lets a process reset it: /proc/self/clear_refs)."""

    def high_water() -> int:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024

    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        yield
        return
    base = high_water()
    try:
        yield
    finally:
        grew = high_water() - base
        assert grew <= limit_bytes, f"the graph grew the process by {grew:,} bytes"


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(hostile=graphs())
@example(hostile=(SHIPPED_ONNX, SHIPPED_TOML))  # used
@example(hostile=(g := allocating([1, 16]), plain_manifest_for(g)))  # used: 64 bytes a run
@example(hostile=(g := allocating([65_536, 65_536]), plain_manifest_for(g)))  # 16 GiB: refused
@example(hostile=(g := allocating([1_024, 65_536]), plain_manifest_for(g)))  # folded: refused
@example(hostile=(g := declared_initializer([2**31, 2**31]), plain_manifest_for(g)))
def test_a_hostile_graph_is_loaded_or_refused_within_budget(
    hostile: tuple[bytes, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the child process a replica checks a package in (its start is most of the time
    budget): the replica does not grow with the graph, and the child stays within its bound."""
    graph, manifest = hostile
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="stream.package_check")
    with package_dir(tmp_path, manifest.encode(), graph) as directory:
        with native_peak(NATIVE_BUDGET_BYTES), within(ONNX_BUDGET, "the graph"):
            try:
                digest = check_package(
                    directory, max_batch_size=64, max_memory_mb=CAP_MB, timeout_s=20.0
                )
            except ConfigurationError as exc:
                assert str(exc)
                digest = None
        if digest is not None:
            assert digest == manifest_digest(load_model_package(directory).manifest)
    # The child's own peak, as it reported it (RUSAGE_CHILDREN would be the largest of every
    # child this test process ever waited for: in a whole run, the service replicas too).
    peaks = [r.check_peak_rss_bytes for r in caplog.records if hasattr(r, "check_peak_rss_bytes")]
    assert all(p is None or p <= CHILD_BUDGET_BYTES for p in peaks), peaks
    if digest is not None:
        assert peaks and peaks[-1] is not None, "a check that passed says its peak"


def test_a_graph_past_the_memory_cap_is_refused_and_one_within_it_serves(tmp_path: Path) -> None:
    """Through the child process a replica checks a package in: the replica's own memory does
    not grow with the graph's."""
    small, huge = allocating([1_024, 1_024]), allocating([65_536, 65_536])  # 4 MiB, 16 GiB
    with package_dir(tmp_path, plain_manifest_for(small).encode(), small) as directory:
        check_package(directory, max_batch_size=64, max_memory_mb=CAP_MB, timeout_s=60.0)
    with (
        package_dir(tmp_path, plain_manifest_for(huge).encode(), huge) as directory,
        native_peak(NATIVE_BUDGET_BYTES),
        within(Budget(MIB, 30.0), "a graph of 16 GiB a run"),
        pytest.raises(ConfigurationError, match="smaller than requested"),
    ):
        check_package(directory, max_batch_size=64, max_memory_mb=CAP_MB, timeout_s=30.0)
