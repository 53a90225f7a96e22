"""The Grafana dashboard and the Prometheus alert rules agree with the metrics the service exports
(stream/metric_definitions.py): every query selects series that exist, with labels they have; every
metric is on a panel; a panel's unit fits what it plots; every alert has a promtool unit test.

The rules themselves are exercised by `promtool test rules` (`make alerts-check`, in CI)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.repo import (
    ALERTS,
    ALERTS_TEST,
    PROMETHEUS,
    ROOT,
    TARGET_LABELS,
    alert_rules,
    dashboard_panels,
    dashboard_targets,
    grouping_labels,
    job_selector,
    load_yaml,
    matcher_labels,
    metric_families,
    promql_series,
    series_names,
)

#: Label names that series outside stream/metric_definitions.py carry, for the rules that use them.
#: `up` is Prometheus' own; kube_* come from kube-state-metrics on Kubernetes.
FOREIGN_SERIES = {
    "up": set(),
    "kube_deployment_status_replicas_unavailable": {"namespace", "deployment"},
}


def check_promql(where: str, expr: str, foreign: dict[str, set[str]] | None = None) -> None:
    """The expression selects defined series, and matches and groups by labels they have."""
    families = metric_families()
    names = series_names()
    foreign = foreign or {}
    used = promql_series(expr)
    assert used, f"{where}: {expr!r} selects no metric"
    unknown = [name for name in used if name not in names and name not in foreign]
    assert not unknown, f"{where}: {unknown} not defined in stream/metric_definitions.py ({expr!r})"
    if "histogram_quantile" in expr:
        assert any(name.endswith("_bucket") for name in used), f"{where}: {expr!r}"
    allowed = {"le"} | TARGET_LABELS
    for name in used:
        allowed |= set(families[names[name]][1]) if name in names else foreign[name]
    labels = grouping_labels(expr) | matcher_labels(expr)
    assert labels <= allowed, f"{where}: {expr!r} uses labels {labels - allowed}"


# ── dashboard ────────────────────────────────────────────────────────────────────────────────


def test_dashboard_queries_only_metrics_that_stream_metrics_defines() -> None:
    targets = list(dashboard_targets())
    assert targets
    for title, target in targets:
        expr = target["expr"]
        check_promql(title, expr)
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        labels = grouping_labels(expr) or {"le"} | TARGET_LABELS
        assert legend <= labels, f"{title}: legend {legend} not among {labels}"


def test_every_metric_is_on_a_panel() -> None:
    names = series_names()
    shown = {
        names[name]
        for _title, target in dashboard_targets()
        for name in promql_series(target["expr"])
        if name in names
    }
    missing = set(metric_families()) - shown
    assert not missing, (
        f"stream/metric_definitions.py exports {sorted(missing)}, on no dashboard panel"
    )


def _quantity(expr: str) -> str:
    """What one target plots, for axis and unit checks: a per-second or per-minute rate of
    events, or the unit in the metric's name (seconds, records, partitions …). A quantile or a
    ratio of two rates of a histogram keeps the histogram's unit; a counter over itself (some
    of its labels over all) is a share, and so is the rate of a counter of seconds (CPU time:
    the share of a core) and a gauge named `_ratio`."""
    (name, *others) = promql_series(expr)
    base = re.sub(r"_(bucket|sum|count|total)$", "", name)
    ratio = re.search(r"\)\s*/\s*\w*\s*\(", expr)
    if ratio and name.endswith("_total") and set(others) <= {name}:
        return "share"
    if name.endswith("_seconds_total") and re.search(r"\brate\s*\(", expr) and not ratio:
        return "share"
    if name.endswith("_ratio"):  # Prometheus's base unit for a share of one
        return "share"
    if re.search(r"\b(i?rate)\s*\(", expr) and "histogram_quantile" not in expr and not ratio:
        return "per minute" if re.search(r"\*\s*60\b", expr) else "per second"
    return base.rsplit("_", 1)[-1]


#: Grafana unit ids (grafana-data valueFormats) by quantity.
UNITS = {
    "per second": {"recps", "eps", "cps"},
    "per minute": {"cpm", "opm", "reqpm"},
    "seconds": {"s", "ms"},
    "share": {"percentunit"},
}


def _axes(panel: dict[str, Any]) -> dict[tuple[str, str], str]:
    """(matcher, legend or query refId) → the axis it is drawn on ("left" unless an override
    moves it); an override matches a series by its name (byName) or by its query
    (byFrameRefID, for a legend that names a label's values)."""
    placement = {}
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        matcher = override["matcher"]
        assert matcher["id"] in ("byName", "byFrameRefID"), f"{panel['title']}: {matcher}"
        for prop in override.get("properties", []):
            if prop["id"] == "custom.axisPlacement":
                placement[matcher["id"], matcher["options"]] = prop["value"]
    return placement


def _axis(placement: dict[tuple[str, str], str], target: dict[str, Any]) -> str:
    by_name = placement.get(("byName", target.get("legendFormat", "")))
    return by_name or placement.get(("byFrameRefID", target.get("refId", "")), "left")


@pytest.mark.parametrize(
    "panel", [p for p in dashboard_panels() if p["type"] == "timeseries"], ids=lambda p: p["title"]
)
def test_a_panel_axis_carries_one_quantity_in_its_unit(panel: dict[str, Any]) -> None:
    # The Backpressure panel once drew paused partitions (0-6) and delivery stalled (0/1) on
    # the 0-20k axis of records in flight, where both read as zero.
    placement = _axes(panel)
    by_axis: dict[str, set[str]] = {}
    for target in panel["targets"]:
        axis = _axis(placement, target)
        by_axis.setdefault(axis, set()).add(_quantity(target["expr"]))
    for axis, quantities in by_axis.items():
        assert len(quantities) == 1, f"{panel['title']}: {axis} axis mixes {quantities}"
    left = by_axis.get("left", set())
    unit = panel["fieldConfig"]["defaults"]["unit"]
    for quantity in left & set(UNITS):
        assert unit in UNITS[quantity], f"{panel['title']}: {quantity} shown in {unit!r}"
    if left and not left & set(UNITS):
        assert unit in {"short", "none"}, f"{panel['title']}: counts {left} shown in {unit!r}"


# ── alert rules ──────────────────────────────────────────────────────────────────────────────


def test_prometheus_loads_the_alert_rules() -> None:
    rule_files = load_yaml(PROMETHEUS).get("rule_files", [])
    assert [PROMETHEUS.parent / f for f in rule_files] == [ALERTS]
    assert load_yaml(ALERTS_TEST)["rule_files"] == [ALERTS.name]


def test_alerts_query_existing_series_with_their_labels() -> None:
    rules = alert_rules()
    assert rules
    for rule in rules:
        check_promql(rule["alert"], rule["expr"], FOREIGN_SERIES)
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        names = series_names()
        for name in promql_series(rule["expr"]):
            if name in names or name == "up":
                # Our series: the scrape job the compose Prometheus and the chart's monitors use.
                selector = job_selector(names.get(name, ""))
                assert selector in rule["expr"], f"{rule['alert']}: {name} unscoped"


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() -> None:
    tests = load_yaml(ALERTS_TEST)["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    alerts = {rule["alert"] for rule in alert_rules()}
    assert alerts <= firing, f"no test fires {sorted(alerts - firing)}"
    # ReplicaDown's test has a replica that recovers and stays quiet inside the firing case.
    assert alerts - {"FraudScorerReplicaDown"} <= quiet, f"never quiet: {sorted(alerts - quiet)}"
    assert (firing | quiet) <= alerts, (
        f"tests of unknown alerts: {sorted((firing | quiet) - alerts)}"
    )


def test_every_alert_links_to_its_runbook_on_the_docs_site() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    headings = set(re.findall(r"^## (\w+)$", runbooks, flags=re.M))
    alerts = {rule["alert"]: rule["annotations"].get("runbook_url") for rule in alert_rules()}
    for alert, url in alerts.items():
        # mkdocs' anchor of a heading that is one word: the word in lower case.
        assert url == "{{ $externalLabels.docs_url }}/runbooks/#" + alert.lower(), alert
        assert alert in headings, f"docs/runbooks.md has no section '## {alert}'"
    assert headings <= set(alerts), f"runbooks of no alert: {sorted(headings - set(alerts))}"
    docs_url = load_yaml(PROMETHEUS)["global"]["external_labels"]["docs_url"]
    assert docs_url.startswith("http"), "the compose Prometheus sets the runbooks' docs_url"
