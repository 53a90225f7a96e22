"""What the deploy tests read: the repository's deploy files, and what the code declares (the
settings ScorerSettings reads, the metrics stream/metric_definitions.py defines). Shared by the
modules of tests/deploy; nothing here starts a process or needs the network."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from packaging.requirements import Requirement
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

import review.metrics
import stream.batch_histogram
import stream.metrics
import terminals.metrics
from review.settings import ReviewSettings
from stream.startup.config import ScorerSettings

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "ops" / "prometheus"
PROMETHEUS = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
GRAFANA = ROOT / "ops" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "fraud-scorer.json"
CHART = ROOT / "deploy" / "helm" / "fraud-scorer"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
LOCKS = ROOT / "requirements"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def config_envs() -> set[str]:
    """Every environment variable ScorerSettings reads."""
    return {s.env for s in ScorerSettings.settings()}


def config_default(name: str) -> Any:
    return getattr(ScorerSettings(), name)


# ── metrics and PromQL ───────────────────────────────────────────────────────────────────────


@cache
def metric_families() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric of stream/metric_definitions.py (the scorer), terminals/metrics.py (the features
    worker) and review/metrics.py (the review console): name → (type, label names)."""
    families: dict[str, tuple[str, tuple[str, ...]]] = {}
    registry = CollectorRegistry()
    owners = (
        stream.metrics.ServiceMetrics(registry),
        terminals.metrics.WorkerMetrics(registry),
        review.metrics.ReviewMetrics(ReviewSettings().case_slo_s),
    )
    for owner in owners:
        for value in vars(owner).values():
            if isinstance(value, MetricWrapperBase):
                (described,) = value.describe()
                families[described.name] = (described.type, tuple(value._labelnames))
            elif isinstance(value, stream.batch_histogram.BatchHistogram):
                for family in value.collect():
                    families[family.name] = (family.type, ())
    assert families, "stream/metric_definitions.py defines no metrics?"
    return families


def job_selector(family: str) -> str:
    """The job matcher a rule on a metric family must carry: the scorer's series come from the
    job fraud-scorer everywhere; the worker's from fraud-features in compose and fraud-scorer
    under the chart's monitors (they label every pod of the release by its name); the review
    console's likewise from fraud-review or fraud-scorer."""
    if family.startswith("fraud_features_"):
        return 'job=~"fraud-(scorer|features)"'
    if family.startswith("fraud_review_"):
        return 'job=~"fraud-(scorer|review)"'
    return 'job="fraud-scorer"'


@cache
def series_names() -> dict[str, str]:
    """Every series name PromQL can select → its family."""
    names: dict[str, str] = {}
    for family, (kind, _labels) in metric_families().items():
        if kind == "counter":
            names[family + "_total"] = family
        elif kind == "histogram":
            names.update({family + suffix: family for suffix in ("_bucket", "_sum", "_count")})
        else:
            names[family] = family
    return names


#: PromQL words that are neither metrics nor functions.
_PROMQL_KEYWORDS = {
    *("by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"),
    *("and", "or", "unless", "inf", "nan"),
}
#: Labels every scraped series has besides its own.
TARGET_LABELS = {"instance", "job"}


def promql_series(expr: str) -> list[str]:
    """The series names an expression selects (functions, keywords, label sets, ranges and
    grouping clauses removed)."""
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    found = []
    for match in re.finditer(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _PROMQL_KEYWORDS:
            continue
        found.append(name)
    return found


def grouping_labels(expr: str) -> set[str]:
    labels: set[str] = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels.update(label.strip() for label in group.split(",") if label.strip())
    return labels


def matcher_labels(expr: str) -> set[str]:
    """Label names used in the selectors' matchers, e.g. {job="x", cause=~"y"}."""
    labels: set[str] = set()
    for selector in re.findall(r"\{([^}]*)\}", expr):
        labels.update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector))
    return labels


def dashboard() -> dict[str, Any]:
    result = json.loads(DASHBOARD.read_text())
    assert isinstance(result, dict)
    return result


def dashboard_panels() -> Iterator[dict[str, Any]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))  # rows may nest panels

    yield from walk(dashboard()["panels"])


def dashboard_targets() -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in dashboard_panels():
        for target in panel.get("targets", []):
            yield panel["title"], target


def alert_rules() -> list[dict[str, Any]]:
    groups = load_yaml(ALERTS)["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


# ── the Dockerfile, .dockerignore, pyproject.toml and the image locks ─────────────────────


@cache
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        keyword, _, rest = (current + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, "Dockerfile ends inside a continuation line"
    return instructions


def instructions(keyword: str) -> list[str]:
    return [rest for kw, rest in dockerfile() if kw == keyword]


def exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


def copy_sources() -> list[str]:
    """Sources of the COPY instructions that read the build context (not --from a stage)."""
    sources: list[str] = []
    for rest in instructions("COPY"):
        parts = shlex.split(rest)
        flags = [p for p in parts if p.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        operands = [p for p in parts if not p.startswith("--")]
        assert len(operands) >= 2, f"COPY {rest}"
        sources.extend(operands[:-1])
    return sources


def dockerignore_patterns() -> list[str]:
    lines = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()]
    patterns = [line.lstrip("/") for line in lines if line and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions are not modelled here"
    return patterns


def ignored(relative: str) -> bool:
    """Whether .dockerignore keeps a path (or a folder above it) out of the build context."""
    path = PurePosixPath(relative)
    candidates = [str(path), *(str(p) for p in path.parents if str(p) != ".")]
    for pattern in dockerignore_patterns():
        variants = [pattern, pattern[3:]] if pattern.startswith("**/") else [pattern]
        if any(fnmatchcase(c, v) for c in candidates for v in variants):
            return True
    return False


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def build_args() -> dict[str, str]:
    """The Dockerfile's ARGs and their defaults."""
    args = {}
    for rest in instructions("ARG"):
        name, _, default = rest.partition("=")
        args[name] = default
    return args


def expand(source: str, **overrides: str) -> str:
    values = {**build_args(), **overrides}
    return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], source)


def variants() -> set[str]:
    """The image variants: one lock each under requirements/."""
    return {lock.stem for lock in LOCKS.glob("*.txt")}


def locked(variant: str) -> dict[str, str]:
    """Package name → pinned version of a lock (the last pin wins where markers split one)."""
    pins = re.findall(
        r"^([A-Za-z0-9_.-]+)==([^\s;]+)", (LOCKS / f"{variant}.txt").read_text(), re.M
    )
    return {name.lower(): version for name, version in pins}


def runtime_requirements() -> list[Requirement]:
    return [Requirement(r) for r in pyproject()["project"]["dependencies"]]
