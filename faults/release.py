"""A released version of the service, installed from its commit into a virtualenv of its own, so
that an upgrade scenario can run it beside this tree's code (`make upgrade-check`).

A clone may not carry tags, so a release is named by its commit in the repository's own history
(CHANGELOG.md gives the same commit). Its source is `git archive`d, not checked out, so the
working tree is never touched. Its dependencies are installed as the release shipped them: from
its CPU image's lock (`requirements/cpu.txt`, pinned and hashed), then the release itself without
dependencies. An install that is there already, for the same commit, is used as it is.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from plumbing.errors import ConfigurationError

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
#: The first release (CHANGELOG.md, "0.1.0"): main as it was when the upgrade check was asked
#: for, before the record formats and the module moves.
FIRST_RELEASE = "0.1.0"
FIRST_RELEASE_COMMIT = "cc13c04445edd7fdaa673978e1106ccafbcbffb1"
DEFAULT_ROOT = REPO / ".upgrade"
#: Written last, so a broken-off install is never taken for a finished one.
_INSTALLED = "installed-commit"
INSTALL_TIMEOUT_S = 900


@dataclass(frozen=True)
class Release:
    """An installed release: its source (the working directory of its processes) and its
    virtualenv."""

    version: str
    commit: str
    root: Path

    @property
    def source(self) -> Path:
        return self.root / "src"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"


def install_release(
    version: str = FIRST_RELEASE, commit: str = FIRST_RELEASE_COMMIT, root: Path = DEFAULT_ROOT
) -> Release:
    """The release, installed under `root/<version>` unless it is there already.

    Raises ConfigurationError when the commit is not in this clone's history (a shallow clone:
    fetch the history first) or the install fails (pip's output ends the message)."""
    release = Release(version, commit, root / version)
    marker = release.root / _INSTALLED
    if marker.is_file() and marker.read_text().strip() == commit and release.python.exists():
        log.info("release %s (%s) is installed in %s", version, commit[:12], release.root)
        return release
    found = _git("cat-file", "-e", f"{commit}^{{commit}}")
    if found.returncode != 0:
        raise ConfigurationError(
            f"release {version} is commit {commit[:12]}, which this clone does not have "
            "(a shallow clone?): run `git fetch --unshallow` and try again"
        )
    shutil.rmtree(release.root, ignore_errors=True)
    release.source.mkdir(parents=True)
    log.info("installing release %s (%s) into %s", version, commit[:12], release.root)
    with tempfile.TemporaryFile() as archive:
        _run(["git", "-C", str(REPO), "archive", "--format=tar", commit], stdout=archive)
        archive.seek(0)
        _run(["tar", "-x", "-C", str(release.source)], stdin=archive)
    _run([sys.executable, "-m", "venv", str(release.root / "venv")])
    pip = [str(release.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--requirement", str(release.source / "requirements" / "cpu.txt")])
    _run([*pip, "--no-deps", str(release.source)])
    marker.write_text(commit + "\n")
    return release


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def _run(
    command: list[str], stdout: IO[bytes] | None = None, stdin: IO[bytes] | None = None
) -> None:
    done = subprocess.run(
        command,
        stdin=stdin,
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        output = (done.stderr or b"").decode(errors="replace")[-2_000:]
        raise ConfigurationError(f"`{' '.join(command[:4])} …` failed: {output}")
