"""plumbing/bounded_read.py: a file is read whole only when it is small enough."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from plumbing.bounded_read import read_bounded
from plumbing.errors import ConfigurationError
from tests.support.budget import MIB, Budget, within


def test_a_file_within_the_bound_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_bytes(b"x" * 1_000)
    assert read_bounded(path, 1_000, "rules file") == b"x" * 1_000


def test_a_file_past_the_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    with path.open("wb") as file:
        file.truncate(64 * MIB)  # sparse: its size says it all
    with (
        within(Budget(peak_bytes=MIB, seconds=1.0), "a 64 MiB file past a 1 MiB bound"),
        pytest.raises(ConfigurationError, match=r"model\.onnx is larger than 1,048,576 bytes: use"),
    ):
        read_bounded(path, MIB, "model.onnx", "use a smaller one")


def test_a_file_whose_size_lies_is_read_only_one_byte_past_the_bound(tmp_path: Path) -> None:
    # A pipe has no size: it is read in pieces, and never past the bound plus one byte.
    fifo = tmp_path / "mapping.toml"
    os.mkfifo(fifo)
    payload = b"y" * (8 * MIB)  # made before the budget counts

    def write() -> None:
        # The reader stops reading past the bound, as it should: the pipe breaks.
        with contextlib.suppress(BrokenPipeError), fifo.open("wb") as sink:
            sink.write(payload)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with (
        within(Budget(peak_bytes=5 * MIB, seconds=5.0), "8 MiB from a pipe past a 2 MiB bound"),
        pytest.raises(ConfigurationError, match="larger than"),
    ):
        read_bounded(fifo, 2 * MIB, "input mapping")
    writer.join(timeout=5)
