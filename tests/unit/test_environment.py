"""The environment check every command makes at start (plumbing/environment.py): a `FRAUD_*`
variable nothing declares stops it, naming the closest declared name; one that another command
reads is a warning naming that command. And the registry is whole: every `FRAUD_*` name the code
reads from the environment, or the docs, the Helm chart, compose and the scripts set, is
declared."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ops.tools.reference_pages import READERS
from plumbing import environment
from plumbing.declared_environment import DECLARED
from plumbing.environment import READ_DIRECTLY, REMOVED, check_environment, readers
from plumbing.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[2]


def test_a_misspelt_variable_stops_the_start_naming_it_and_the_closest_declared_name():
    with pytest.raises(ConfigurationError) as refused:
        check_environment("fraud-scorer", {"FRAUD_RULE": "/etc/fraud/rules.toml"})
    assert str(refused.value) == (
        "FRAUD_RULE is not a setting of any command; did you mean FRAUD_RULES?"
    )


def test_every_unknown_variable_is_named_in_one_line():
    with pytest.raises(ConfigurationError) as refused:
        check_environment(
            "fraud-features", {"FRAUD_RULE": "x", "FRAUD_ZZZZZZZZ": "1", "FRAUD_LOG_LEVEL": "INFO"}
        )
    message = str(refused.value)
    assert "\n" not in message
    assert "FRAUD_RULE is not a setting of any command; did you mean FRAUD_RULES?" in message
    assert "FRAUD_ZZZZZZZZ is not a setting of any command" in message
    assert "LOG_LEVEL" not in message


def test_a_removed_variable_stops_every_command_saying_what_to_do_instead():
    for command in ("fraud-scorer", "fraud-features"):
        with pytest.raises(ConfigurationError) as refused:
            check_environment(command, {"FRAUD_PROCESSES": "2", "FRAUD_RULES": "rules.toml"})
        assert str(refused.value) == (
            "FRAUD_PROCESSES was removed after release 0.1.0: run one fraud-scorer process per "
            "pod or container, and more replicas for more cores (docs/architecture.md)"
        )
    assert check_environment("fraud-scorer", {"FRAUD_PROCESSES": ""}) == []


def test_a_removed_variable_is_declared_by_no_command():
    assert not set(REMOVED) & set(readers())


def test_a_variable_of_another_command_is_a_warning_naming_it_and_the_own_setting():
    warnings = check_environment("fraud-features", {"FRAUD_METRICS_PORT": "9200"})
    assert warnings == [
        "FRAUD_METRICS_PORT is read by fraud-scorer, not by fraud-features: ignored; "
        "fraud-features's own is FRAUD_FEATURES_METRICS_PORT"
    ]


def test_own_shared_empty_and_foreign_prefixed_variables_pass_silently():
    environ = {
        "FRAUD_RULES": "rules.toml",  # its own
        "FRAUD_INPUT_TOPIC": "tx",  # shared with fraud-features and fraud-loadgen
        "FRAUD_RULE": "",  # empty counts as not set, as for every setting
        "KAFKA_BOOTSTRAP_SERVERS": "k:9092",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
        "NOT_FRAUD_X": "1",
    }
    assert check_environment("fraud-scorer", environ) == []


def test_a_tool_that_starts_replicas_reads_their_variables_as_its_own():
    environ = {"FRAUD_RULES": "rules.toml", "FRAUD_FEATURES_APP_ID": "f"}
    assert check_environment("python -m faults", environ, passes_on=("fraud-scorer",)) == [
        "FRAUD_FEATURES_APP_ID is read by fraud-features, not by python -m faults: ignored"
    ]


def test_the_test_suite_s_variables_are_declared_and_only_warned_about():
    warnings = check_environment("fraud-scorer", {"FRAUD_HOSTILE_EXAMPLES": "50"})
    assert warnings == [
        "FRAUD_HOSTILE_EXAMPLES is read by the test suite, not by fraud-scorer: ignored"
    ]


def test_the_registry_is_every_command_s_declared_settings():
    expected: dict[str, set[str]] = {}
    for command, settings in READERS:
        for setting in settings.settings():
            if setting.env.startswith(environment.PREFIX):
                expected.setdefault(setting.env, set()).add(command)
    assert {name: set(commands) for name, commands in DECLARED.items()} == expected
    assert DECLARED["FRAUD_RULES"] == ("fraud-scorer",)
    assert DECLARED["FRAUD_FEATURES_METRICS_PORT"] == ("fraud-features",)


# -- the registry is whole ---------------------------------------------------------------------

#: Where the project's Python code lives (the tools and tests read variables too).
PACKAGES = (
    "bench",
    "contracts",
    "deadletter",
    "faults",
    "flywheel",
    "loadgen",
    "model_tools",
    "ops",
    "plumbing",
    "scorer",
    "simulator",
    "stream",
    "terminals",
    "tests",
    "training",
)
_ENV_CALLS = {"get", "getenv", "setdefault", "pop"}


def _environment_reads(path: Path) -> set[str]:
    """The `FRAUD_*` names `path` reads from, or sets for, an environment: `os.environ[...]`,
    `os.environ.get(...)`, `os.getenv(...)`, `monkeypatch.setenv(...)`, and the keys of an
    `env=` mapping given to a subprocess."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[ast.expr] = []
        if isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value):
            names.append(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if (node.func.attr in _ENV_CALLS and "environ" in owner) or node.func.attr in (
                "getenv",
                "setenv",
                "delenv",
            ):
                names.extend(node.args[:1])
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "env" and isinstance(keyword.value, ast.Dict):
                    names.extend(k for k in keyword.value.keys if k is not None)
        for name in names:
            value = name.value if isinstance(name, ast.Constant) else None
            if isinstance(value, str) and value.startswith(environment.PREFIX):
                found.add(value)
    return found


def test_every_variable_the_code_reads_directly_is_declared():
    declared = readers()
    read = {
        name: path.relative_to(REPO)
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
        for name in _environment_reads(path)
    }
    assert {"FRAUD_HOSTILE_EXAMPLES", "FRAUD_CARD_HISTORY"} <= set(read), "the scan sees them"
    undeclared = {name: str(where) for name, where in read.items() if name not in declared}
    assert not undeclared, f"declare them (plumbing/environment.py, READ_DIRECTLY): {undeclared}"


def test_the_directly_read_names_are_not_also_a_command_s_setting():
    assert not set(READ_DIRECTLY) & set(DECLARED)


#: Files that set or name `FRAUD_*` variables for people and machines: every name there must
#: be one the project reads. (CHANGELOG.md and bench/results/ are history: they may name what
#: was renamed since; docs/ may name what was removed, `REMOVED`, to say what to do instead.)
DOCUMENTS = (
    "README.md",
    "Dockerfile",
    "Makefile",
    "docker-compose.yml",
    "docker-compose.gpu.yml",
    "pyproject.toml",
    "mkdocs.yml",
    "docs",
    "deploy",
    "ops",
    "examples",
    "scorer/models",
)
_NAME = re.compile(r"\bFRAUD_[A-Z0-9_]*[A-Z0-9]\b")


def _documents() -> list[Path]:
    found: list[Path] = []
    for entry in DOCUMENTS:
        path = REPO / entry
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.is_file()
                and not p.is_symlink()  # docs/changelog.md is CHANGELOG.md
                and p.suffix not in (".py", ".onnx", ".npy", ".png", ".svg")
            )
    return found


def test_every_variable_the_docs_chart_compose_and_scripts_name_is_declared():
    declared = readers()
    stale: dict[str, str] = {}
    for path in _documents():
        text = path.read_text(errors="replace")
        for name in set(_NAME.findall(text)):
            # `--help` shows an option's value as its name in capitals: not a variable.
            flag = "--" + name.lower().replace("_", "-")
            if name in REMOVED and path.is_relative_to(REPO / "docs"):
                continue
            if name not in declared and not re.search(rf"{flag}[ =]{name}\b", text):
                stale[name] = str(path.relative_to(REPO))
    assert not stale, f"names no command declares: {stale}"
