"""The Helm chart (deploy/helm/fraud-scorer) agrees with the service and with itself.

Helm is not needed here: the values files are parsed, and the templates are read as text for
the few contracts that live in them (which value feeds which setting). `make helm-check` renders
the chart with Helm and has a real kube-apiserver accept the result (server-side dry run)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from plumbing.health import HealthServer, HealthState
from review.settings import ReviewSettings
from stream.startup.config import ScorerSettings
from terminals.config import FeaturesSettings
from terminals.health import STALL_AFTER_S, WorkerHealth
from tests.deploy.repo import (
    ALERTS,
    CHART,
    ROOT,
    alert_rules,
    config_envs,
    load_yaml,
)

TEMPLATES = CHART / "templates"
VALUES_FILES = [CHART / "values.yaml", CHART / "values-gpu.yaml"]
SCHEMA = CHART / "values.schema.json"
#: The chart's copy of the alert rules: a symbolic link to ops/prometheus/alerts.yml.
CHART_ALERTS = CHART / "files" / "alerts.yml"


def values(*overlays: str) -> dict[str, Any]:
    """values.yaml merged with overlays (file names in the chart), as Helm merges them."""

    def merge(base: Any, override: Any) -> Any:
        if not (isinstance(base, dict) and isinstance(override, dict)):
            return override
        return {**base, **{k: merge(base.get(k), v) for k, v in override.items()}}

    result: dict[str, Any] = load_yaml(CHART / "values.yaml")
    for overlay in overlays:
        result = merge(result, load_yaml(CHART / overlay))
    return result


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def all_templates() -> str:
    return "\n".join(path.read_text() for path in sorted(TEMPLATES.glob("*")))


#: The fraud-features worker's Deployment: the worker's settings, not the scorer's.
FEATURES_TEMPLATE = "features.yaml"
REVIEW_TEMPLATE = "review.yaml"


def scorer_templates() -> str:
    paths = sorted(
        p for p in TEMPLATES.glob("*") if p.name not in (FEATURES_TEMPLATE, REVIEW_TEMPLATE)
    )
    return "\n".join(path.read_text() for path in paths)


def env_value_expr(variable: str) -> str:
    """The template expression the chart sets an environment variable to."""
    match = re.search(
        rf"- name: {variable}\n\s+value: (\{{\{{.*?\}}\}})", all_templates(), re.MULTILINE
    )
    assert match, f"the chart does not set {variable}"
    return match.group(1)


def field_expr(text: str, key: str) -> str:
    match = re.search(rf"^\s*{key}: (\{{\{{.*?\}}\}})\s*$", text, re.MULTILINE)
    assert match, f"no {key}: {{{{ … }}}} in the template"
    return match.group(1)


def values_ref(expression: str) -> str:
    """The .Values path an expression reads, e.g. `.Values.kafka.groupId`."""
    refs = re.findall(r"\.Values(?:\.\w+)+", expression)
    assert len(refs) == 1, expression
    return str(refs[0])


# ── the service's settings ───────────────────────────────────────────────────────────────────


def test_every_variable_the_chart_sets_is_one_the_service_reads() -> None:
    set_in_templates = set(re.findall(r"- name: ((?:FRAUD|KAFKA)_\w+)", scorer_templates()))
    set_in_values = {name for path in VALUES_FILES for name in load_yaml(path).get("env", {})}
    assert set_in_templates, "the chart sets no environment"
    unknown = (set_in_templates | set_in_values) - config_envs()
    assert not unknown, (
        f"the chart sets {sorted(unknown)}, which stream/startup/config.py never reads"
    )


@pytest.mark.parametrize("overlays", [(), ("values-gpu.yaml",)], ids=["default", "gpu"])
def test_the_values_env_passes_the_services_validation(overlays: tuple[str, ...]) -> None:
    env = {k: str(v) for k, v in values(*overlays)["env"].items()}
    config = ScorerSettings.from_sources({}, env)
    if overlays:
        assert config.device == "cuda"


def test_the_free_form_env_cannot_override_what_the_chart_derives() -> None:
    helpers = template("_helpers.tpl")
    reserved = set(re.findall(r'"((?:FRAUD|KAFKA)_\w+)"', helpers.split("$reserved := list")[1]))
    derived = set(re.findall(r"- name: ((?:FRAUD|KAFKA)_\w+)", scorer_templates()))
    assert derived <= reserved, f"not reserved: {sorted(derived - reserved)}"
    for path in VALUES_FILES:
        assert not reserved & set(load_yaml(path).get("env", {})), path.name


def test_every_variable_the_features_worker_gets_is_one_it_reads() -> None:
    set_there = set(re.findall(r"- name: ((?:FRAUD|KAFKA)_\w+)", template(FEATURES_TEMPLATE)))
    assert set_there, "the features worker gets no environment"
    unknown = set_there - {setting.env for setting in FeaturesSettings.settings()}
    assert not unknown, f"the chart sets {sorted(unknown)}, which fraud-features never reads"


def test_every_variable_the_review_console_gets_is_one_it_reads() -> None:
    set_there = set(re.findall(r"- name: ((?:FRAUD|KAFKA)_\w+)", template(REVIEW_TEMPLATE)))
    assert {"FRAUD_OUTPUT_TOPIC", "FRAUD_REVIEW_DB"} <= set_there
    unknown = set_there - {setting.env for setting in ReviewSettings.settings()}
    assert not unknown, f"the chart sets {sorted(unknown)}, which fraud-review never reads"
    # What the chart's values allow, the console accepts.
    review = values()["review"]
    ReviewSettings.from_sources(
        {},
        {
            "FRAUD_REVIEW_PORT": str(review["port"]),
            "FRAUD_REVIEW_CASE_SLO_S": str(review["caseSloSeconds"]),
            "FRAUD_REVIEW_SECURE_COOKIES": review["secureCookies"],
        },
    )


# ── KEDA ─────────────────────────────────────────────────────────────────────────────────────


def test_keda_watches_the_group_and_topic_the_replicas_consume() -> None:
    scaled = template("scaledobject.yaml")
    assert values_ref(field_expr(scaled, "consumerGroup")) == values_ref(
        env_value_expr("FRAUD_GROUP_ID")
    )
    assert values_ref(field_expr(scaled, "topic")) == values_ref(
        env_value_expr("FRAUD_INPUT_TOPIC")
    )
    assert values_ref(field_expr(scaled, "bootstrapServers")) == values_ref(
        env_value_expr("KAFKA_BOOTSTRAP_SERVERS")
    )
    for key in ("lagThreshold", "activationLagThreshold"):
        assert values_ref(field_expr(scaled, key)) == f".Values.autoscaling.{key}"


def test_max_replicas_default_to_the_partitions_the_topics_job_creates() -> None:
    scaled = template("scaledobject.yaml")
    expression = field_expr(scaled, "maxReplicaCount")
    assert re.fullmatch(
        r"\{\{ default \.Values\.kafka\.partitions \.Values\.autoscaling\.maxReplicaCount \}\}",
        expression,
    ), expression
    assert values()["autoscaling"]["maxReplicaCount"] is None
    job = template("topics-job.yaml")
    partitions = re.search(r"- --partitions\n\s+- (\{\{.*?\}\})", job)
    assert partitions and values_ref(partitions.group(1)) == ".Values.kafka.partitions"
    assert 'allowIdleConsumers: "false"' in scaled, "replicas beyond the partitions idle"


def test_the_hpa_fallback_has_kedas_bounds() -> None:
    hpa = template("hpa.yaml")
    assert field_expr(hpa, "maxReplicas") == field_expr(
        template("scaledobject.yaml"), "maxReplicaCount"
    )
    assert ".Values.autoscaling.minReplicaCount" in field_expr(hpa, "minReplicas")
    assert "requests" in values()["resources"] and "cpu" in values()["resources"]["requests"], (
        "an HPA on CPU utilization needs the scorer's CPU request"
    )


def _capability(template_text: str) -> str:
    """The API a template is guarded by, as `.Capabilities.APIVersions.Has` names it."""
    (api,) = re.findall(r'\.Capabilities\.APIVersions\.Has "([^"]+)"', template_text)
    return str(api)


def _kind(template_text: str) -> str:
    api_version = re.search(r"^apiVersion: (\S+)$", template_text, re.MULTILINE)
    kind = re.search(r"^kind: (\S+)$", template_text, re.MULTILINE)
    assert api_version and kind
    return f"{api_version.group(1)}/{kind.group(1)}"


def test_keda_and_the_prometheus_operator_are_asked_for_what_is_rendered() -> None:
    # A guard that names another API than the object it guards renders nothing, or fails.
    helpers = template("_helpers.tpl")
    keda = helpers[helpers.index('define "fraud-scorer.keda"') :]
    assert _capability(keda) == _kind(template("scaledobject.yaml"))
    assert template("scaledobject.yaml").startswith('{{- if include "fraud-scorer.keda" . }}')
    assert 'not (include "fraud-scorer.keda" .)' in template("hpa.yaml").splitlines()[0]
    rule = template("prometheusrule.yaml")
    assert _capability(rule) == _kind(rule) == "monitoring.coreos.com/v1/PrometheusRule"


def test_keda_scales_the_workload_kind_the_scorer_runs_as() -> None:
    # workload: StatefulSet (stable transactional ids for exactly-once) must move both.
    assert "kind: {{ .Values.workload }}" in template("deployment.yaml")
    assert "kind: {{ .Values.workload }}" in template("scaledobject.yaml")
    assert "kind: {{ .Values.workload }}" in template("hpa.yaml")
    assert values()["workload"] == "Deployment"
    identity = re.search(r"- name: FRAUD_INSTANCE_ID\n(.*\n){3}", template("deployment.yaml"))
    assert identity and "fieldPath: metadata.name" in identity.group(0), "the pod name is the id"


def test_scaling_thresholds_are_sane() -> None:
    autoscaling = values()["autoscaling"]
    assert 0 < autoscaling["activationLagThreshold"] < autoscaling["lagThreshold"]
    assert 1 <= autoscaling["minReplicaCount"] <= values()["kafka"]["partitions"]


# ── pods ─────────────────────────────────────────────────────────────────────────────────────


def test_termination_grace_outlasts_the_drain() -> None:
    deployment = template("deployment.yaml")
    assert (
        values_ref(env_value_expr("FRAUD_SHUTDOWN_TIMEOUT_S")) == ".Values.shutdownTimeoutSeconds"
    )
    grace = field_expr(deployment, "terminationGracePeriodSeconds")
    assert grace == (
        "{{ add .Values.shutdownTimeoutSeconds .Values.terminationGraceMarginSeconds }}"
    ), grace
    assert values()["terminationGraceMarginSeconds"] > 0
    assert "preStop:" not in deployment, "a preStop hook's time counts against the grace"


def _probes(deployment: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+Probe):\n\s+httpGet:\n\s+path: (\S+)", deployment))


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_probes_ask_the_service_what_they_mean() -> None:
    probes = _probes(template("deployment.yaml"))
    assert set(probes) == {"startupProbe", "livenessProbe", "readinessProbe"}
    state = HealthState()
    server = HealthServer("127.0.0.1", 0, state)
    server.start()
    try:
        # Starting: alive, not ready. The liveness and startup probes must pass, readiness not.
        assert _status(server.port, probes["livenessProbe"]) == 200
        assert _status(server.port, probes["startupProbe"]) == 200
        assert _status(server.port, probes["readinessProbe"]) == 503
        state.set_ready(True)
        assert _status(server.port, probes["readinessProbe"]) == 200
        state.set_ready(False, "delivery stalled")
        assert _status(server.port, probes["readinessProbe"]) == 503
        assert _status(server.port, probes["livenessProbe"]) == 200
    finally:
        server.close()


def test_the_features_probes_ask_the_worker_what_they_mean() -> None:
    probes = _probes(template(FEATURES_TEMPLATE))
    assert set(probes) == {"startupProbe", "livenessProbe", "readinessProbe"}
    now = [0.0]
    health = WorkerHealth(clock=lambda: now[0])
    server = HealthServer("127.0.0.1", 0, health)
    server.start()
    try:
        # Recovering its table: alive, not ready.
        assert _status(server.port, probes["startupProbe"]) == 200
        assert _status(server.port, probes["livenessProbe"]) == 200
        assert _status(server.port, probes["readinessProbe"]) == 503
        health.recovered(True)
        assert _status(server.port, probes["readinessProbe"]) == 200
        # Its event loop silent for too long: restarted (and not ready meanwhile).
        now[0] += STALL_AFTER_S + 1
        health.router_beat()
        assert _status(server.port, probes["livenessProbe"]) == 503
        assert _status(server.port, probes["readinessProbe"]) == 503
    finally:
        server.close()


def test_the_features_worker_is_probed_where_it_serves_its_health() -> None:
    features = template(FEATURES_TEMPLATE)
    assert values_ref(env_value_expr("FRAUD_FEATURES_METRICS_PORT")) == (
        ".Values.features.metricsPort"
    )
    port = re.search(r"- name: (\S+)\n\s+containerPort: (\{\{.*?\}\})", features)
    assert port and values_ref(port.group(2)) == ".Values.features.metricsPort"
    probed = set(re.findall(r"Probe:\n\s+httpGet:\n\s+path: \S+\n\s+port: (\S+)", features))
    assert probed == {port.group(1)}


def test_the_scorer_s_one_metrics_port_is_exposed_probed_and_scraped() -> None:
    # One process per pod (docs/architecture.md): one port, `metrics`, which the Service
    # exposes, the probes ask and the monitors scrape (the features pods name theirs the same).
    deployment = template("deployment.yaml")
    assert "- name: metrics\n              containerPort: {{ .Values.metrics.port }}" in deployment
    assert set(re.findall(r"\n\s+port: (\S+)", deployment)) == {"metrics"}
    service = template("service.yaml")
    assert "port: {{ .Values.metrics.port }}\n      targetPort: metrics" in service
    for monitor in ("servicemonitor.yaml", "podmonitor.yaml"):
        assert "- port: metrics\n      path: /metrics" in template(monitor), monitor
    assert ".Values.processes" not in all_templates()


def test_the_metrics_port_is_one_value() -> None:
    deployment = template("deployment.yaml")
    assert values_ref(env_value_expr("FRAUD_METRICS_PORT")) == ".Values.metrics.port"
    assert values_ref(field_expr(deployment, "containerPort")) == ".Values.metrics.port"


def test_pods_run_as_the_images_user() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (uid,) = re.findall(r"^USER (\d+)", dockerfile, re.MULTILINE)
    helpers = template("_helpers.tpl")
    assert f"runAsUser: {uid}" in helpers and "runAsNonRoot: true" in helpers
    assert "readOnlyRootFilesystem: true" in helpers


def test_the_kafka_config_secret_is_mounted_where_the_setting_points() -> None:
    helpers = template("_helpers.tpl")
    directory = re.search(r'define "fraud-scorer.kafkaConfigDir" -\}\}(\S+?)\{\{', helpers)
    assert directory, "no kafkaConfigDir helper"
    file_expr = env_value_expr("FRAUD_KAFKA_CONFIG_FILE")
    assert 'include "fraud-scorer.kafkaConfigDir"' in file_expr
    assert ".Values.kafka.config.key" in file_expr
    assert 'mountPath: {{ include "fraud-scorer.kafkaConfigDir" . }}' in helpers
    assert "path: {{ $.root.Values.kafka.config.key }}" in helpers


def test_the_topics_hook_needs_nothing_the_release_creates_after_it() -> None:
    # A pre-install hook runs before the release's objects exist: the Job mounts and runs as
    # its own hook-scoped Secret and ServiceAccount, weighted before it (make helm-check
    # installs the chart and checks that they exist when the Job is created).
    job = template("topics-job.yaml")
    before = re.search(r'"helm.sh/hook-weight" "(-?\d+)"', job)
    own = re.search(r'helm.sh/hook-weight: "(-?\d+)"', job)
    assert before and own and int(before.group(1)) < int(own.group(1))
    assert '"helm.sh/hook" "pre-install,pre-upgrade"' in job
    assert "helm.sh/hook: pre-install,pre-upgrade" in job
    assert '"kafkaSecret" (include "fraud-scorer.topicsKafkaConfigSecret" .)' in job
    assert '"serviceAccount" (include "fraud-scorer.topicsServiceAccountName" .)' in job
    for other in ("deployment.yaml", FEATURES_TEMPLATE):
        assert '"fraud-scorer.topics' not in template(other), f"{other} uses the Job's objects"


# ── values and their schema ──────────────────────────────────────────────────────────────────


def _declared(schema: dict[str, Any], value: Any, path: str) -> Iterator[str]:
    """Paths of values that a strict object of the schema does not declare."""
    schema = _resolve(schema)
    if not isinstance(value, dict) or "properties" not in schema:
        return
    for key, item in value.items():
        if key not in schema["properties"]:
            if schema.get("additionalProperties") is False:
                yield f"{path}.{key}"
            continue
        yield from _declared(schema["properties"][key], item, f"{path}.{key}")


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    if "$ref" not in schema:
        return schema
    resolved: dict[str, Any] = json.loads(SCHEMA.read_text())
    for part in schema["$ref"].removeprefix("#/").split("/"):
        resolved = resolved[part]
    return resolved


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_every_value_is_in_the_schema(path: Any) -> None:
    schema = json.loads(SCHEMA.read_text())
    assert schema["additionalProperties"] is False, "unknown top-level keys are refused"
    assert not list(_declared(schema, load_yaml(path), "")), path.name


def test_the_schema_knows_what_the_templates_compare() -> None:
    properties = json.loads(SCHEMA.read_text())["properties"]
    assert properties["workload"]["enum"] == ["Deployment", "StatefulSet"]
    anti = set(re.findall(r'\.Values\.antiAffinity "(\w+)"', template("deployment.yaml")))
    assert anti < set(properties["antiAffinity"]["enum"])
    # `processes` was removed (one process per pod): an upgrade that still sets it is refused
    # as an unknown key (ops/k8s/must-reject-values.txt has make helm-check try it).
    assert "processes" not in properties


def test_the_gpu_profile_asks_for_a_gpu_and_the_cuda_provider() -> None:
    gpu = values("values-gpu.yaml")
    resources = gpu["resources"]
    # Extended resources cannot be overcommitted: Kubernetes wants requests == limits.
    assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"] >= 1
    assert gpu["env"]["FRAUD_DEVICE"] == "cuda"
    assert gpu["image"]["tag"] != values()["image"]["tag"], "the GPU profile needs the CUDA image"


# ── monitoring ───────────────────────────────────────────────────────────────────────────────


def test_monitors_name_the_job_the_alert_rules_select() -> None:
    chart = load_yaml(CHART / "Chart.yaml")
    exprs = [rule["expr"] for rule in alert_rules()]
    jobs = {job for expr in exprs for job in re.findall(r'job="([^"]+)"', expr)}
    assert jobs == {chart["name"]}, f"alerts select {jobs}, the chart's pods are {chart['name']}"
    for pattern in {job for expr in exprs for job in re.findall(r'job=~"([^"]+)"', expr)}:
        assert re.fullmatch(pattern, chart["name"]), f"job=~{pattern!r} misses {chart['name']}"
    for name in ("servicemonitor.yaml", "podmonitor.yaml"):
        text = template(name)
        assert "jobLabel: app.kubernetes.io/name" in text, name
        assert "path: /metrics" in text, name
    helpers = template("_helpers.tpl")
    assert 'app.kubernetes.io/name: {{ include "fraud-scorer.name" . }}' in helpers


def test_the_prometheus_rule_holds_the_alert_rules_of_ops_prometheus() -> None:
    # One set of rules for compose and Kubernetes: the chart's file is a symbolic link to
    # ops/prometheus/alerts.yml (helm package stores the file itself), read as it is today.
    assert CHART_ALERTS.is_symlink(), "a copy would drift: link it (ln -s) instead"
    assert CHART_ALERTS.resolve() == ALERTS.resolve()
    assert CHART_ALERTS.read_bytes() == ALERTS.read_bytes()
    assert '.Files.Get "files/alerts.yml"' in template("prometheusrule.yaml")
    helmignore = CHART / ".helmignore"
    assert not helmignore.exists() or "files" not in helmignore.read_text()
