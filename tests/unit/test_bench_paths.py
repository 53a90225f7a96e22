"""Benchmark results name paths relative to the repository: a committed results file must not
depend on, or reveal, the machine it was measured on."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.harness import REPO, shown


def test_paths_inside_the_repository_are_shown_relative_and_others_as_given() -> None:
    assert shown(REPO / "bench" / "results" / "logs") == "bench/results/logs"
    assert shown(Path("/elsewhere/x.json")) == "/elsewhere/x.json"


def test_no_tracked_file_names_the_checkout_it_lives_in() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    needle = str(REPO).encode()
    naming = [
        name.decode()
        for name in tracked
        if name
        and (REPO / name.decode()).is_file()
        and needle in (REPO / name.decode()).read_bytes()
    ]
    assert naming == [], f"files that name {REPO}: {naming}"
