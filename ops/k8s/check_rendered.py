"""Contracts of the rendered chart that only hold once Helm has filled in the values: the
environment the pods get is one the service reads and accepts; the scorer's metrics port is
exposed and scraped; the autoscaler (KEDA's ScaledObject or the HPA fallback) scales the
scorer's workload, and only its pods, to at most the partitions the topics Job creates; the
pre-install hook Job mounts and runs as nothing the release creates after it; the features
worker is probed where it serves its health; the PrometheusRule holds ops/prometheus/alerts.yml.

    .venv/bin/python ops/k8s/check_rendered.py RENDERED.yaml ...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from plumbing.kafka_settings import CONFIG_FILE_ENV
from stream.startup.config import ScorerSettings
from terminals.config import FeaturesSettings

ALERTS = Path(__file__).resolve().parents[2] / "ops" / "prometheus" / "alerts.yml"
#: How alerts.yml's runbook links start; the chart may put prometheusRule.docsUrl instead.
DOCS_URL_TEMPLATE = "{{ $externalLabels.docs_url }}"
#: The variables the chart's env and extraEnv may set beyond each command's own settings:
#: only FRAUD_* and KAFKA_* names are the commands' (extraEnv may add OTEL_*, proxies, ...).
OWN_PREFIXES = ("FRAUD_", "KAFKA_")
#: What the scorer may run as (the chart's `workload`).
SCORER_KINDS = ("Deployment", "StatefulSet")
HOOK = "helm.sh/hook"
HOOK_WEIGHT = "helm.sh/hook-weight"

Doc = dict[str, Any]


def _component(doc: Doc) -> str:
    return str(doc["metadata"].get("labels", {}).get("app.kubernetes.io/component", "scorer"))


def _annotations(doc: Doc) -> dict[str, str]:
    return dict(doc["metadata"].get("annotations") or {})


def _own(names: set[str]) -> set[str]:
    return {name for name in names if name.startswith(OWN_PREFIXES)}


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def check_features(deployment: Doc) -> list[str]:
    """The features worker's pods get only settings fraud-features reads, and are probed on
    the port where it serves /healthz and /readyz."""
    problems = []
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    known = {setting.env for setting in FeaturesSettings.settings()}
    if unknown := _own(set(env)) - known:
        problems.append(f"the features pods get {sorted(unknown)}, which fraud-features ignores")
    # The Kafka properties file is mounted in the pod, not here: its settings are not checked.
    plain = {k: v for k, v in env.items() if v is not None and k != CONFIG_FILE_ENV}
    try:
        port = FeaturesSettings.from_sources({}, plain).metrics_port
    except Exception as exc:
        return [*problems, f"fraud-features rejects its pods' environment: {exc}"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if ports.get("metrics") != port:
        problems.append(f"features port metrics {ports.get('metrics')} != its health port {port}")
    probes = {
        kind: (container.get(kind) or {}).get("httpGet", {})
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    expected = {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    for kind, path in expected.items():
        if (probes[kind].get("path"), probes[kind].get("port")) != (path, "metrics"):
            problems.append(f"the features worker's {kind} is {probes[kind]}, not {path}")
    return problems


def check_scraping(by_kind: dict[tuple[str, str], Doc], expected: dict[str, int]) -> list[str]:
    """The Service and the monitors expose and scrape the scorer's port (by its name)."""
    problems = []
    for (kind, _name), doc in by_kind.items():
        if kind == "Service":
            targets = {p["targetPort"] for p in doc["spec"]["ports"]}
            if targets != set(expected):
                problems.append(f"the Service targets {sorted(targets)}, not {sorted(expected)}")
        elif kind in ("ServiceMonitor", "PodMonitor"):
            key = "endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"
            scraped = {e["port"] for e in doc["spec"][key]}
            if scraped != set(expected):
                problems.append(f"the {kind} scrapes {sorted(scraped)}, not {sorted(expected)}")
    return problems


def check_autoscaler(
    by_kind: dict[tuple[str, str], Doc], scorer: Doc, config: ScorerSettings
) -> list[str]:
    problems = []
    scaled = [
        d for (k, _), d in by_kind.items() if k in ("ScaledObject", "HorizontalPodAutoscaler")
    ]
    if len(scaled) > 1:
        return [f"{len(scaled)} autoscalers rendered: KEDA's and the HPA fallback both?"]
    jobs = [d for (k, _), d in by_kind.items() if k == "Job"]
    for doc in scaled:
        target = doc["spec"]["scaleTargetRef"]
        if (target["kind"], target["name"]) != (scorer["kind"], scorer["metadata"]["name"]):
            problems.append(f"the {doc['kind']} scales {target['kind']}/{target['name']}")
        most = doc["spec"].get("maxReplicaCount", doc["spec"].get("maxReplicas"))
        for job in jobs:
            args = job["spec"]["template"]["spec"]["containers"][0]["args"]
            partitions = int(args[args.index("--partitions") + 1])
            if most > partitions:
                problems.append(f"{doc['kind']} max replicas {most} > {partitions} partitions")
        if doc["kind"] == "ScaledObject":
            (trigger,) = doc["spec"]["triggers"]
            meta = trigger["metadata"]
            expected = (config.group_id, config.input_topic, config.bootstrap_servers)
            actual = (meta["consumerGroup"], meta["topic"], meta["bootstrapServers"])
            if actual != expected:
                problems.append(f"KEDA watches {actual}, the replicas consume {expected}")
        else:
            (container,) = scorer["spec"]["template"]["spec"]["containers"]
            if "cpu" not in container.get("resources", {}).get("requests", {}):
                problems.append("the HPA scales on CPU utilization, the scorer requests no CPU")
    if scaled and "replicas" in scorer["spec"]:
        problems.append("the autoscaled workload sets replicas: each upgrade would reset them")
    return problems


def check_hooks(docs: list[Doc]) -> list[str]:
    """A hook Job runs before the release's own objects exist: each Secret it mounts and the
    ServiceAccount it runs as must be an existing one or a hook of its own that comes first."""
    problems = []
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for job in (d for d in docs if d["kind"] == "Job" and HOOK in _annotations(d)):
        events = set(_annotations(job)[HOOK].split(","))
        weight = int(_annotations(job).get(HOOK_WEIGHT, "0"))
        pod = job["spec"]["template"]["spec"]
        needs = [("ServiceAccount", pod.get("serviceAccountName", "default"))]
        needs += [("Secret", v["secret"]["secretName"]) for v in pod["volumes"] if "secret" in v]
        for kind, name in needs:
            doc = rendered.get((kind, name))
            if doc is None:
                continue  # not the chart's: it exists before the install
            hook = _annotations(doc)
            if not events <= set(hook.get(HOOK, "").split(",")):
                problems.append(
                    f"hook Job {job['metadata']['name']} needs {kind}/{name}, "
                    f"which the release creates only after its {sorted(events)} hooks"
                )
            elif int(hook.get(HOOK_WEIGHT, "0")) >= weight:
                problems.append(f"hook {kind}/{name} is not weighted before the Job that needs it")
    return problems


def check_rules(rule: Doc) -> list[str]:
    """The PrometheusRule's groups are alerts.yml's, but for where the runbook links point."""
    groups = rule["spec"]["groups"]
    for group in groups:
        for entry in group["rules"]:
            annotations = entry.get("annotations", {})
            url = annotations.get("runbook_url", "")
            if "/runbooks/" in url and not url.startswith(DOCS_URL_TEMPLATE):
                annotations["runbook_url"] = DOCS_URL_TEMPLATE + url[url.index("/runbooks/") :]
    if groups != yaml.safe_load(ALERTS.read_text())["groups"]:
        return [f"the PrometheusRule's rules differ from {ALERTS.name}"]
    return []


def check(docs: list[Doc]) -> list[str]:
    problems: list[str] = []
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    workloads = [d for (kind, _), d in by_kind.items() if kind in SCORER_KINDS]
    features = [d for d in workloads if _component(d) == "features"]
    for worker in features:
        problems += check_features(worker)
    scorers = [d for d in workloads if _component(d) != "features"]
    if len(scorers) != 1:
        return [f"{len(scorers)} scorer workloads rendered, expected 1"]
    (scorer,) = scorers
    if scorer["kind"] == "StatefulSet":
        governing = scorer["spec"]["serviceName"]
        if ("Service", governing) not in by_kind:
            problems.append(f"the StatefulSet's serviceName {governing!r} is not rendered")
    selector = scorer["spec"]["selector"]["matchLabels"]
    for worker in features:
        if _matches(selector, worker["spec"]["template"]["metadata"]["labels"]):
            problems.append("the scorer's selector matches the features pods (and so its HPA)")
    pod = scorer["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    if unknown := _own(set(env)) - {s.env for s in ScorerSettings.settings()}:
        problems.append(f"the pods get {sorted(unknown)}, which the service does not read")
    plain = {k: v for k, v in env.items() if v is not None and k.startswith(OWN_PREFIXES)}
    try:
        config = ScorerSettings.from_sources({}, plain)
    except Exception as exc:
        problems.append(f"the service rejects the pods' environment: {exc}")
        return problems
    grace = pod["terminationGracePeriodSeconds"]
    if not grace > config.shutdown_timeout_s:
        problems.append(f"termination grace {grace}s <= drain {config.shutdown_timeout_s}s")
    expected = {"metrics": config.metrics_port}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if ports != expected:
        problems.append(f"the scorer's ports {ports} != its metrics port {expected}")
    problems += check_scraping(by_kind, expected)
    problems += check_autoscaler(by_kind, scorer, config)
    problems += check_hooks(docs)
    accounts = {d["spec"]["template"]["spec"].get("serviceAccountName") for d in workloads}
    if len(accounts) != 1:
        problems.append(f"the scorer and the features worker run as {sorted(map(str, accounts))}")
    for (kind, _name), doc in by_kind.items():
        if kind == "PrometheusRule":
            problems += check_rules(doc)
    return problems


def main() -> int:
    status = 0
    for path in map(Path, sys.argv[1:]):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        problems = check(docs)
        print(f"  {'ok  ' if not problems else 'FAIL'} {path.name}: {len(docs)} objects")
        for problem in problems:
            print(f"       {problem}")
        status |= bool(problems)
    return status


if __name__ == "__main__":
    sys.exit(main())
