"""What the deploy tests read: the repository's deploy files, and what the code declares (the
settings ServiceConfig reads, the metrics stream/metrics.py defines). Shared by the modules of
tests/deploy; nothing here starts a process or needs the network."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

import stream.metrics
from stream.config import ServiceConfig, settings

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "ops" / "prometheus"
PROMETHEUS = PROMETHEUS_DIR / "prometheus.yml"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts_test.yml"
GRAFANA = ROOT / "ops" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "fraud-scorer.json"
CHART = ROOT / "deploy" / "helm" / "fraud-scorer"


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def config_envs() -> set[str]:
    """Every environment variable ServiceConfig reads."""
    return {s.env for s in settings()}


def config_default(name: str) -> Any:
    return getattr(ServiceConfig(), name)


# ── metrics and PromQL ───────────────────────────────────────────────────────────────────────


@cache
def metric_families() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every metric of stream/metrics.py: name → (type, label names)."""
    families: dict[str, tuple[str, tuple[str, ...]]] = {}
    service_metrics = stream.metrics.ServiceMetrics(CollectorRegistry())
    for value in vars(service_metrics).values():
        if isinstance(value, MetricWrapperBase):
            (described,) = value.describe()
            families[described.name] = (described.type, tuple(value._labelnames))
        elif isinstance(value, stream.metrics.BatchHistogram):
            for family in value.collect():
                families[family.name] = (family.type, ())
    assert families, "stream/metrics.py defines no metrics?"
    return families


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
