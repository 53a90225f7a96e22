"""The project's environment variables: every `FRAUD_*` name something of the project reads,
and the check each command makes of its environment before it starts.

A `FRAUD_*` variable that nothing declares is a mistake: a misspelt `FRAUD_RULE` (meant:
`FRAUD_RULES`) would otherwise start the scorer without its deny list, and nobody would know.
So `check_environment` refuses it, in one line naming it and the closest declared name, before
any setting is read. A variable that a release read and this one does not (`REMOVED`) is
refused the same way, saying what to do instead: a deployment that still sets it expects a
behaviour that is gone. A variable that another command reads but this one does not (the
scorer's `FRAUD_METRICS_PORT` given to `fraud-features`, whose setting is
`FRAUD_FEATURES_METRICS_PORT`) is a warning naming its readers, since one environment often
serves several commands.

The declared names are those of every command's settings (`plumbing/settings.py`), listed in
`plumbing/declared_environment.py`, which `python -m ops.tools.reference_pages` writes from the
declarations, since this package may not import the commands; and `READ_DIRECTLY` below: the
few names read straight from `os.environ`, by the test suite. tests/unit/test_environment.py
checks that every such read, and every `FRAUD_*` name of the docs, the Helm chart and compose,
is declared.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping

from plumbing.declared_environment import DECLARED
from plumbing.errors import ConfigurationError

PREFIX = "FRAUD_"

#: The readers of the `FRAUD_*` variables read from `os.environ` rather than a command's
#: settings; the name of a reader is what a warning says.
TEST_SUITE = "the test suite"
READ_DIRECTLY: dict[str, tuple[str, ...]] = {
    # How many examples tests/integration/test_hostile_input.py tries (CI sets more).
    "FRAUD_HOSTILE_EXAMPLES": (TEST_SUITE,),
    # How many examples the registry formats' budget tests try (docs/testing.md).
    "FRAUD_BUDGET_EXAMPLES": (TEST_SUITE,),
    # Where the integration tests find MLflow and the Schema Registry (docs/testing.md).
    "FRAUD_TEST_MLFLOW_TRACKING_URI": (TEST_SUITE,),
    "FRAUD_TEST_SCHEMA_REGISTRY_URL": (TEST_SUITE,),
}

#: `FRAUD_*` variables that a release read and this one does not → what to do instead. Each
#: stops every command that finds it set (never declared again under the same name).
REMOVED: dict[str, str] = {
    "FRAUD_PROCESSES": "removed after release 0.1.0: run one fraud-scorer process per pod or "
    "container, and more replicas for more cores (docs/architecture.md)",
}


def readers() -> dict[str, tuple[str, ...]]:
    """Every declared `FRAUD_*` name → what reads it (commands, the test suite)."""
    merged = {name: tuple(commands) for name, commands in DECLARED.items()}
    for name, others in READ_DIRECTLY.items():
        merged[name] = (*merged.get(name, ()), *others)
    return merged


def check_environment(
    command: str,
    environ: Mapping[str, str] | None = None,
    *,
    passes_on: Iterable[str] = (),
    declared: Mapping[str, tuple[str, ...]] | None = None,
) -> list[str]:
    """Check the `FRAUD_*` variables set (not empty) in `environ` (`os.environ` by default)
    for `command`, before it reads any.

    Raises ConfigurationError, one line, naming every variable nothing declares and the
    closest declared name, and every removed one (`REMOVED`) with what to do instead. Returns
    one warning per variable that `command` does not read and another reader does
    (`passes_on`: the commands it starts with its own environment, whose variables it reads as
    theirs). `declared`: name → readers (by default, the project's).
    """
    environ = os.environ if environ is None else environ
    known = readers() if declared is None else dict(declared)
    mine = {command, *passes_on}
    own = sorted(name for name, who in known.items() if mine & set(who))
    refused: list[str] = []
    warnings: list[str] = []
    for name in sorted(environ):
        if not name.startswith(PREFIX) or not environ[name]:
            continue
        who = known.get(name)
        if name in REMOVED:
            refused.append(f"{name} was {REMOVED[name]}")
        elif who is None:
            refused.append(_unknown(name, known))
        elif not mine & set(who):
            warnings.append(_foreign(name, who, command, own))
    if refused:
        raise ConfigurationError("; ".join(refused))
    return warnings


def _unknown(name: str, known: Iterable[str]) -> str:
    closest = _closest(name, known)
    hint = f"; did you mean {closest}?" if closest else ""
    return f"{name} is not a setting of any command{hint}"


def _foreign(name: str, readers: tuple[str, ...], command: str, own: list[str]) -> str:
    closest = _closest(name, own)
    hint = f"; {command}'s own is {closest}" if closest else ""
    return f"{name} is read by {', '.join(readers)}, not by {command}: ignored{hint}"


def _closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like `name`, compared without the prefix they all share."""
    bare = {candidate.removeprefix(PREFIX): candidate for candidate in candidates}
    found = difflib.get_close_matches(name.removeprefix(PREFIX), list(bare), n=1, cutoff=0.6)
    return bare[found[0]] if found else None
