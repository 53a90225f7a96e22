"""Contracts of the rendered chart that only hold once Helm has filled in the values: the
environment the pods get is one the service reads and accepts, and KEDA watches the group and
topic that the replicas consume, scaling to at most the partitions the topics Job creates.

    .venv/bin/python ops/k8s/check_rendered.py RENDERED.yaml ...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from contracts.kafka_settings import CONFIG_FILE_ENV, OPTIONS_ENV
from stream.config import ServiceConfig, settings
from terminals.config import OPTIONS as WORKER_OPTIONS


def _component(doc: dict[str, Any]) -> str:
    return str(doc["metadata"].get("labels", {}).get("app.kubernetes.io/component", "scorer"))


def check_features(deployment: dict[str, Any]) -> list[str]:
    """The features worker's pods get only settings fraud-features reads."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"] for e in container["env"]}
    known = {option.env for option in WORKER_OPTIONS} | {CONFIG_FILE_ENV, OPTIONS_ENV}
    unknown = env - known
    return [f"the features pods get {sorted(unknown)}, which fraud-features does not read"] * bool(
        unknown
    )


#: What the scorer may run as (the chart's `workload`).
SCORER_KINDS = ("Deployment", "StatefulSet")


def check(docs: list[dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    workloads = [d for (kind, _), d in by_kind.items() if kind in SCORER_KINDS]
    for features in (d for d in workloads if _component(d) == "features"):
        problems += check_features(features)
    scorers = [d for d in workloads if _component(d) != "features"]
    if len(scorers) != 1:
        return [f"{len(scorers)} scorer workloads rendered, expected 1"]
    (scorer,) = scorers
    if scorer["kind"] == "StatefulSet":
        governing = scorer["spec"]["serviceName"]
        if ("Service", governing) not in by_kind:
            problems.append(f"the StatefulSet's serviceName {governing!r} is not rendered")
    pod = scorer["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    known = {s.env for s in settings()}
    if unknown := set(env) - known:
        problems.append(f"the pods get {sorted(unknown)}, which the service does not read")
    plain = {k: v for k, v in env.items() if v is not None}
    try:
        config = ServiceConfig.from_sources({}, plain)
    except Exception as exc:
        problems.append(f"the service rejects the pods' environment: {exc}")
        return problems
    grace = pod["terminationGracePeriodSeconds"]
    if not grace > config.shutdown_timeout_s:
        problems.append(f"termination grace {grace}s <= drain {config.shutdown_timeout_s}s")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if ports.get("metrics") != config.metrics_port:
        problems.append(f"metrics port {ports.get('metrics')} != {config.metrics_port}")
    for (kind, _name), doc in by_kind.items():
        if kind == "ScaledObject":
            (trigger,) = doc["spec"]["triggers"]
            meta = trigger["metadata"]
            expected = (config.group_id, config.input_topic, config.bootstrap_servers)
            actual = (meta["consumerGroup"], meta["topic"], meta["bootstrapServers"])
            if actual != expected:
                problems.append(f"KEDA watches {actual}, the replicas consume {expected}")
            target = doc["spec"]["scaleTargetRef"]
            scaled = (target["kind"], target["name"])
            if scaled != (scorer["kind"], scorer["metadata"]["name"]):
                problems.append(f"the ScaledObject scales {target['kind']}/{target['name']}")
            jobs = [d for (k, _), d in by_kind.items() if k == "Job"]
            for job in jobs:
                args = job["spec"]["template"]["spec"]["containers"][0]["args"]
                partitions = int(args[args.index("--partitions") + 1])
                most = doc["spec"]["maxReplicaCount"]
                if most > partitions:
                    problems.append(f"maxReplicaCount {most} > {partitions} partitions")
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
