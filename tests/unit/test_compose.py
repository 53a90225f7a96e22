"""The container files agree with the code: docker-compose.yml, docker-compose.gpu.yml, the
Dockerfile, .dockerignore, and the Prometheus and Grafana files under ops/.

Nothing here needs Docker: the files are parsed and checked against what the code declares
(ServiceConfig's settings and their environment variables, fraud-loadgen's parser, the console
scripts and package data of pyproject.toml, the metrics of stream/metrics.py). Compose
interpolation (`${NAME:-default}`) is resolved to its default, as on a machine with no .env.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

import stream.metrics
from loadgen import cli as loadgen_cli
from stream import cli as scorer_cli
from stream.config import ServiceConfig, settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS = ROOT / "ops" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "ops" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "fraud-scorer.json"

#: Services whose names other files rely on (Prometheus DNS, Grafana's datasource URL, README).
SCORER, TOPICS, LOADGEN, KAFKA = "scorer", "topics", "loadgen", "kafka"
PROMETHEUS_SERVICE, GRAFANA_SERVICE = "prometheus", "grafana"


# ── loading ──────────────────────────────────────────────────────────────────────────────────


_DEFAULTED = re.compile(r"\$\{(?P<name>\w+):?-(?P<default>[^}]*)\}")


def interpolate(value: Any) -> Any:
    """Resolve compose interpolation to the defaults; a variable without a default fails."""
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if not isinstance(value, str):
        return value
    resolved = _DEFAULTED.sub(lambda m: m.group("default"), value)
    assert "$" not in resolved.replace("$$", ""), (
        f"{value!r}: every compose variable needs a default (${{NAME:-default}}), so the stack "
        "runs without a .env file"
    )
    return resolved.replace("$$", "$")


@cache
def raw_compose(path: Path = COMPOSE) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict) and isinstance(document.get("services"), dict), path
    return document


@cache
def compose(path: Path = COMPOSE) -> dict[str, Any]:
    resolved = interpolate(raw_compose(path))
    assert isinstance(resolved, dict)
    return resolved


def service(name: str, path: Path = COMPOSE) -> dict[str, Any]:
    services = compose(path)["services"]
    assert name in services, f"{path.name} has no service {name!r}"
    result = services[name]
    assert isinstance(result, dict)
    return result


def merged_service(name: str) -> dict[str, Any]:
    """The service as `docker compose -f docker-compose.yml -f docker-compose.gpu.yml` sees it
    (mappings merged key by key, anything else replaced: enough for what is checked here)."""

    def merge(base: Any, override: Any) -> Any:
        if not (isinstance(base, dict) and isinstance(override, dict)):
            return override
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base[key], value) if key in base else value
        return merged

    result = merge(service(name), service(name, GPU_OVERRIDE))
    assert isinstance(result, dict)
    return result


def environment(svc: dict[str, Any]) -> dict[str, str]:
    """A service's environment as the container sees it (list or mapping form)."""
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    result: dict[str, str] = {}
    for key, value in env.items():
        # Compose accepts strings and numbers; YAML true/false is rejected ("invalid type").
        valid = isinstance(value, str | int | float) and not isinstance(value, bool)
        assert value is None or valid, f"environment {key}={value!r}: quote it"
        if value is not None:
            result[key] = str(value)
    return result


def config_envs() -> set[str]:
    return {s.env for s in settings()}


def config_default(name: str) -> Any:
    return getattr(ServiceConfig(), name)


def metrics_port() -> int:
    """The port the compose scorer serves metrics on: its env, else ServiceConfig's default."""
    return int(
        environment(service(SCORER)).get("FRAUD_METRICS_PORT", config_default("metrics_port"))
    )


def host_path(source: str, base: Path = ROOT) -> Path | None:
    """The host path of a bind-mount source, or None for a named volume."""
    if source.startswith((".", "/")):
        return (base / source).resolve()
    return None


def bind_mounts(svc: dict[str, Any]) -> dict[str, Path]:
    """container path → host path of a service's bind mounts (short and long syntax)."""
    mounts: dict[str, Path] = {}
    for volume in svc.get("volumes") or []:
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        path = host_path(source)
        if path is not None:
            mounts[target.rstrip("/")] = path
    return mounts


def through_mounts(svc: dict[str, Any], container_path: str) -> Path | None:
    """Where a container path of a service lives on the host, if a bind mount provides it."""
    path = PurePosixPath(container_path)
    for target, source in bind_mounts(svc).items():
        if path == PurePosixPath(target) or PurePosixPath(target) in path.parents:
            return source / path.relative_to(target)
    return None


def _uses_our_image(svc: dict[str, Any]) -> bool:
    build = svc.get("build")
    context = build if isinstance(build, str) else (build or {}).get("context")
    return context is not None and (ROOT / context).resolve() == ROOT


def our_services() -> dict[str, dict[str, Any]]:
    """Services that run the image built from this repository's Dockerfile."""
    return {name: svc for name, svc in compose()["services"].items() if _uses_our_image(svc)}


# ── Dockerfile ───────────────────────────────────────────────────────────────────────────────


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


# ── metrics ──────────────────────────────────────────────────────────────────────────────────


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
_TARGET_LABELS = {"instance", "job"}


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


def dashboard_targets() -> Iterator[tuple[str, dict[str, Any]]]:
    dashboard = json.loads(DASHBOARD.read_text())

    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
        for panel in panels:
            yield from walk(panel.get("panels", []))  # rows may nest panels
            for target in panel.get("targets", []):
                yield panel["title"], target

    yield from walk(dashboard["panels"])


# ── environment variables ────────────────────────────────────────────────────────────────────


def test_compose_runs_the_scorer_topics_and_loadgen_from_our_dockerfile() -> None:
    assert {SCORER, TOPICS, LOADGEN} <= set(our_services())
    for name, svc in our_services().items():
        build = svc["build"]
        dockerfile_name = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
        assert (ROOT / (dockerfile_name or "Dockerfile")).resolve() == DOCKERFILE, name
        # One tag for all three, so `up` builds one image and `run loadgen` does not pull.
        assert svc.get("image") == service(SCORER)["image"], name


@pytest.mark.parametrize("name", [SCORER, TOPICS])
def test_fraud_scorer_services_set_only_variables_serviceconfig_reads(name: str) -> None:
    env = environment(service(name))
    unknown = {k for k in env if k.startswith(("FRAUD_", "KAFKA_"))} - config_envs()
    assert not unknown, f"{name} sets {sorted(unknown)}, which stream/config.py never reads"
    # The values are valid too: the same parsing and validation as `fraud-scorer run`.
    ServiceConfig.from_sources({}, env)


def test_loadgen_sets_only_variables_its_parser_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    env = environment(service(LOADGEN))
    assert env, "loadgen needs at least the bootstrap servers and topics"
    for name in env:
        monkeypatch.setenv(name, f"sentinel-{name}")
    defaults = set(vars(loadgen_cli.build_parser().parse_args([])).values())
    unread = {name for name in env if f"sentinel-{name}" not in defaults}
    assert not unread, f"loadgen sets {sorted(unread)}, which loadgen/cli.py never reads"


def test_clients_bootstrap_to_a_listener_kafka_advertises() -> None:
    advertised = environment(service(KAFKA))["KAFKA_ADVERTISED_LISTENERS"]
    endpoints = {urlsplit(listener).netloc for listener in advertised.split(",")}
    for name in (SCORER, TOPICS, LOADGEN):
        servers = environment(service(name))["KAFKA_BOOTSTRAP_SERVERS"]
        assert set(servers.split(",")) <= endpoints, f"{name}: {servers} not in {advertised}"


def test_kafka_is_a_single_kraft_node_with_a_broker_healthcheck() -> None:
    kafka = service(KAFKA)
    assert kafka["image"].startswith("apache/kafka:")
    env = environment(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(env["KAFKA_NODE_ID"] + "@")
    for setting in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
    ):
        assert env[setting] == "1", setting
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    test = kafka["healthcheck"]["test"]
    assert "/opt/kafka/bin/kafka-broker-api-versions.sh" in " ".join(test)


# ── commands, ordering, scaling ──────────────────────────────────────────────────────────────


def test_commands_parse_with_the_real_parsers() -> None:
    scripts = pyproject()["project"]["scripts"]
    (entrypoint,) = [exec_form(rest) for rest in instructions("ENTRYPOINT")]
    (default_command,) = [exec_form(rest) for rest in instructions("CMD")]
    assert entrypoint == ["fraud-scorer"] and entrypoint[0] in scripts
    assert default_command == ["run"]
    scorer_cli.build_parser().parse_args(default_command)
    scorer_cli.build_parser().parse_args(service(SCORER).get("command", default_command))
    scorer_cli.build_parser().parse_args(service(TOPICS)["command"])

    loadgen = service(LOADGEN)
    program, *flags = loadgen["entrypoint"]
    assert program == "fraud-loadgen" and program in scripts
    loadgen_cli.build_parser().parse_args([*flags, *loadgen.get("command", [])])


def test_topics_are_created_once_with_the_partitions_variable_before_the_scorer_starts() -> None:
    raw = raw_compose()["services"][TOPICS]["command"]
    partitions = raw[raw.index("--partitions") + 1]
    assert re.fullmatch(r"\$\{PARTITIONS:-\d+\}", partitions), partitions
    args = scorer_cli.build_parser().parse_args(service(TOPICS)["command"])
    assert args.command == "create-topics" and args.partitions >= 1
    assert service(TOPICS)["restart"] == "no"
    assert service(TOPICS)["depends_on"][KAFKA]["condition"] == "service_healthy"
    assert service(SCORER)["depends_on"][TOPICS]["condition"] == "service_completed_successfully"


def test_the_scorer_scales() -> None:
    scorer = service(SCORER)
    assert "container_name" not in scorer, "a fixed container name allows one replica only"
    assert "hostname" not in scorer, "replicas would share a hostname, hence an instance id"
    for port in scorer.get("ports", []):
        published = port.get("published") if isinstance(port, dict) else str(port).count(":")
        assert not published, f"host port {port!r}: a second replica could not bind it"
    assert "FRAUD_INSTANCE_ID" not in environment(scorer), "every replica would share it"


def test_the_instance_id_default_comes_from_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the compose file relies on: each container has its own hostname.
    monkeypatch.setattr(socket, "gethostname", lambda: "c0ffee123456")
    assert ServiceConfig().instance_id.startswith("c0ffee123456")


def _seconds(duration: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def test_docker_waits_longer_than_the_drain_before_sigkill() -> None:
    scorer = service(SCORER)
    timeout_s = float(
        environment(scorer).get("FRAUD_SHUTDOWN_TIMEOUT_S", config_default("shutdown_timeout_s"))
    )
    grace = scorer.get("stop_grace_period", "10s")  # Docker's default
    assert _seconds(str(grace)) > timeout_s


def test_only_the_load_generator_is_behind_a_profile() -> None:
    assert service(LOADGEN).get("profiles"), "loadgen must not start with a plain `up`"
    for name, svc in compose()["services"].items():
        if name != LOADGEN:
            assert not svc.get("profiles"), f"{name} would not start with a plain `up`"


# ── ports ────────────────────────────────────────────────────────────────────────────────────


def test_metrics_port_agrees_everywhere() -> None:
    default = config_default("metrics_port")
    (exposed,) = instructions("EXPOSE")
    assert int(exposed.split("/")[0]) == default, "Dockerfile EXPOSE"
    (healthcheck,) = instructions("HEALTHCHECK")
    probe = " ".join(exec_form(healthcheck[healthcheck.index("CMD") + 3 :].strip()))
    assert "FRAUD_METRICS_PORT" in probe and f"'{default}'" in probe and "/healthz" in probe

    port = metrics_port()
    assert str(port) in {str(p) for p in service(SCORER).get("expose", [])}
    loadgen_argv = service(LOADGEN)["entrypoint"]
    metrics_url = urlsplit(loadgen_argv[loadgen_argv.index("--metrics-url") + 1])
    assert (metrics_url.hostname, metrics_url.port, metrics_url.path) == (SCORER, port, "/metrics")


def test_prometheus_discovers_every_scorer_replica_on_the_metrics_port() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = [
        (job, sd)
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        if SCORER in sd.get("names", [])
    ]
    assert len(jobs) == 1, "one scrape job resolving the scorer service"
    job, sd = jobs[0]
    assert sd.get("type", "SRV") == "A", "compose DNS answers A records, not SRV"
    assert sd["port"] == metrics_port()
    assert job.get("metrics_path", "/metrics") == "/metrics"
    prometheus = service(PROMETHEUS_SERVICE)
    assert through_mounts(prometheus, "/etc/prometheus/prometheus.yml") == PROMETHEUS


# ── files ────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("path", [COMPOSE, GPU_OVERRIDE], ids=lambda p: p.name)
def test_every_mounted_file_exists(path: Path) -> None:
    mounts = [m for svc in compose(path)["services"].values() for m in bind_mounts(svc).values()]
    if path == COMPOSE:
        assert mounts, "prometheus and grafana mount files from ops/"
    for mount in mounts:
        assert mount.exists(), f"{path.name} mounts {mount}, which is not in the repository"
        assert ROOT in mount.parents, f"{mount} is outside the repository"


def test_dockerfile_copies_exactly_the_package_and_nothing_ignored() -> None:
    sources = copy_sources()
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
        assert not ignored(source), f"COPY {source}: excluded by .dockerignore"
    project = pyproject()
    packages = project["tool"]["setuptools"]["packages"]
    needed = {"pyproject.toml", project["project"]["readme"], *packages}
    assert set(sources) == needed, "copy what `pip install .` needs, no more"
    for package, globs in project["tool"]["setuptools"]["package-data"].items():
        for pattern in globs:
            matches = list((ROOT / package).glob(pattern))
            assert matches, f"package-data {package}/{pattern} matches nothing"
            for match in matches:
                assert not ignored(str(match.relative_to(ROOT))), match
    for package in packages:
        for module in (ROOT / package).rglob("*.py"):
            if "__pycache__" not in module.parts:
                assert not ignored(str(module.relative_to(ROOT))), module


def test_dockerignore_keeps_local_state_out() -> None:
    local_state = [
        *(".venv/bin/python", ".kafka/data", ".git/HEAD", "tests/unit/test_compose.py"),
        *(".mypy_cache/x", ".pytest_cache/x", ".ruff_cache/x", "fraud_scorer.egg-info/PKG-INFO"),
        "stream/__pycache__/cli.cpython-312.pyc",
    ]
    for path in local_state:
        assert ignored(path), f".dockerignore lets {path} into the build context"


def test_dockerfile_runs_as_non_root_with_a_selectable_base() -> None:
    (user,) = instructions("USER")
    assert user.split(":")[0] not in ("root", "0")
    first, *_ = dockerfile()
    assert first[0] == "ARG" and first[1].startswith("BASE_IMAGE=python:")
    assert first[1].endswith("-slim")
    minor = re.search(r"python:3\.(\d+)", first[1])
    assert minor is not None and int(minor[1]) >= 11, "pyproject.toml requires Python 3.11+"
    assert any(rest.startswith("${BASE_IMAGE}") for rest in instructions("FROM"))


def test_gpu_override_reserves_an_nvidia_gpu_and_builds_a_cuda_image() -> None:
    scorer = merged_service(SCORER)
    devices = scorer["deploy"]["resources"]["reservations"]["devices"]
    assert any(
        d.get("driver") == "nvidia"
        and "gpu" in d.get("capabilities", [])
        and (d.get("count") in (1, "all") or d.get("device_ids"))
        for d in devices
    ), devices
    env = environment(scorer)
    assert env["FRAUD_DEVICE"] == "cuda"
    ServiceConfig.from_sources({}, env)
    args = scorer["build"]["args"]
    declared = {rest.split("=")[0] for rest in instructions("ARG")}
    assert set(args) <= declared, f"build args {set(args) - declared} are not ARGs"
    base = args["BASE_IMAGE"]
    assert base.startswith("nvidia/cuda:") and "cudnn" in base and "runtime" in base, base
    assert scorer["image"] != service(SCORER)["image"], "the CUDA build would overwrite the CPU tag"


# ── Grafana ──────────────────────────────────────────────────────────────────────────────────


def test_grafana_provisioning_is_mounted_and_wired_to_prometheus() -> None:
    grafana = service(GRAFANA_SERVICE)
    provisioning = through_mounts(grafana, "/etc/grafana/provisioning")
    assert provisioning == GRAFANA / "provisioning"

    datasources = [
        source
        for file in sorted((provisioning / "datasources").glob("*.y*ml"))
        for source in yaml.safe_load(file.read_text())["datasources"]
    ]
    (prometheus,) = [d for d in datasources if d["type"] == "prometheus"]
    url = urlsplit(prometheus["url"])
    assert url.hostname == PROMETHEUS_SERVICE
    published = {str(p).rsplit(":", 1)[-1] for p in service(PROMETHEUS_SERVICE).get("ports", [])}
    assert str(url.port) in published | {"9090"}

    providers = [
        provider
        for file in sorted((provisioning / "dashboards").glob("*.y*ml"))
        for provider in yaml.safe_load(file.read_text())["providers"]
    ]
    assert providers
    for provider in providers:
        folder = through_mounts(grafana, provider["options"]["path"])
        assert folder is not None and DASHBOARD.parent == folder, provider
    home = environment(grafana).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert through_mounts(grafana, home) == DASHBOARD

    uids = {target.get("datasource", {}).get("uid") for _title, target in dashboard_targets()}
    assert uids == {prometheus["uid"]}, "every query uses the provisioned datasource"


def test_dashboard_queries_only_metrics_that_stream_metrics_defines() -> None:
    families = metric_families()
    names = series_names()
    targets = list(dashboard_targets())
    assert targets
    for title, target in targets:
        expr = target["expr"]
        used = promql_series(expr)
        assert used, f"{title}: {expr!r} selects no metric"
        unknown = [name for name in used if name not in names]
        assert not unknown, f"{title}: {unknown} not defined in stream/metrics.py ({expr!r})"
        if "histogram_quantile" in expr:
            assert any(name.endswith("_bucket") for name in used), f"{title}: {expr!r}"
        allowed = {"le"} | _TARGET_LABELS
        for name in used:
            allowed |= set(families[names[name]][1])
        assert grouping_labels(expr) <= allowed, f"{title}: {expr!r} groups by unknown labels"
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        assert legend <= (grouping_labels(expr) or allowed), f"{title}: legend {legend}"


def test_dashboard_has_the_promised_panels() -> None:
    used = {
        name for _title, target in dashboard_targets() for name in promql_series(target["expr"])
    }
    promised = {
        "fraud_decisions_produced_total",  # throughput by decision
        "fraud_records_consumed_total",
        "fraud_event_to_decision_seconds_bucket",  # latency percentiles
        "fraud_batch_size_records_bucket",  # batch size
        "fraud_batch_size_cap_records",
        "fraud_consumer_lag_records",  # lag
        "fraud_time_lag_seconds",
        "fraud_dead_letters_total",  # dead letters by reason
        "fraud_degraded_decisions_total",
        "fraud_execution_provider_info",
    }
    assert promised <= used, f"missing panels for {sorted(promised - used)}"
