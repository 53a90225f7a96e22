"""The container files agree with the code: docker-compose.yml, docker-compose.gpu.yml, the
compose-check override, the Dockerfile, .dockerignore and the image locks.

Nothing here needs Docker: the files are parsed and checked against what the code declares
(ServiceConfig's settings and their environment variables, fraud-loadgen's parser, the console
scripts, packages and package data of pyproject.toml). Compose interpolation
(`${NAME:-default}`) is resolved to its default, as on a machine with no .env. `make
compose-check` runs the stack itself.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import tomllib
from fnmatch import fnmatchcase
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from packaging.requirements import Requirement

from loadgen import cli as loadgen_cli
from stream import cli as scorer_cli
from stream.config import ServiceConfig
from tests.deploy.repo import (
    DASHBOARD,
    GRAFANA,
    PROMETHEUS,
    PROMETHEUS_DIR,
    ROOT,
    config_default,
    config_envs,
    dashboard_targets,
)

COMPOSE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
STANDINS = ROOT / "ops" / "compose" / "standins.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
LOCKS = ROOT / "requirements"
README = ROOT / "README.md"

#: Services whose names other files rely on (Prometheus DNS, the loadgen's metrics URL, README).
SCORER, TOPICS, LOADGEN, KAFKA, REPORTS = "scorer", "topics", "loadgen", "kafka", "reports"
PROMETHEUS_SERVICE = "prometheus"


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


# ── environment variables ────────────────────────────────────────────────────────────────────


def test_compose_runs_the_scorer_topics_and_loadgen_from_our_dockerfile() -> None:
    assert {SCORER, TOPICS, LOADGEN} <= set(our_services())
    for name, svc in our_services().items():
        build = svc["build"]
        dockerfile_name = "Dockerfile" if isinstance(build, str) else build.get("dockerfile")
        assert (ROOT / (dockerfile_name or "Dockerfile")).resolve() == DOCKERFILE, name
        # One tag for all of them, so `up` builds one image and `run loadgen` does not pull.
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


def test_kafka_is_a_single_kraft_node() -> None:
    env = environment(service(KAFKA))
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(env["KAFKA_NODE_ID"] + "@")
    for setting in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
    ):
        assert env[setting] == "1", setting
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"


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


def test_only_the_load_tools_are_behind_a_profile() -> None:
    assert service(LOADGEN).get("profiles"), "loadgen must not start with a plain `up`"
    for name, svc in compose()["services"].items():
        if name not in (LOADGEN, REPORTS):
            assert not svc.get("profiles"), f"{name} would not start with a plain `up`"
    # `run loadgen` starts what it depends on, so it must not depend on a service that its
    # profile does not enable.
    profiles = set(service(LOADGEN)["profiles"])
    for dependency in service(LOADGEN)["depends_on"]:
        needed = set(service(dependency).get("profiles", []))
        assert not needed or needed & profiles, f"loadgen depends on {dependency} ({needed})"


def test_every_profile_the_docs_name_exists() -> None:
    # `--profile load` once did nothing at all: the profile was called otherwise.
    profiles = {p for svc in compose()["services"].values() for p in svc.get("profiles", [])}
    for path in (README, COMPOSE, GPU_OVERRIDE, ROOT / "ops" / "compose" / "check.sh"):
        for named in re.findall(r"compose\b[^\n]*?--profile[ =](\S+)", path.read_text()):
            assert named in profiles, f"{path.name} names --profile {named}; profiles: {profiles}"


def _named_volume_of(svc: dict[str, Any], container_path: str) -> str | None:
    """The named volume that holds a container path of a service, if one does."""
    path = PurePosixPath(container_path)
    for volume in svc.get("volumes") or []:
        source, target = (
            volume.split(":")[:2]
            if isinstance(volume, str)
            else (volume.get("source", ""), volume["target"])
        )
        if host_path(source) is None and (
            path == PurePosixPath(target) or PurePosixPath(target) in path.parents
        ):
            return str(source)
    return None


def test_the_load_report_is_kept_in_a_volume_the_image_user_can_write() -> None:
    loadgen = service(LOADGEN)
    argv = [*loadgen["entrypoint"], *loadgen.get("command", [])]
    args = loadgen_cli.build_parser().parse_args(argv[1:])
    assert args.report is not None, "loadgen writes no report"
    volume = _named_volume_of(loadgen, str(args.report))
    assert volume in compose()["volumes"], f"{args.report} is not in a named volume"
    # A new named volume takes the owner of the image's folder at its mount point: the
    # Dockerfile must create that folder for the user the image runs as.
    (user,) = instructions("USER")
    uid = user.split(":")[0]
    mount = next(
        target
        for v in loadgen["volumes"]
        for source, target in [v.split(":")[:2]]
        if source == volume
    )
    created = [rest for rest in instructions("RUN") if re.search(rf"-o {uid}\b.*\s{mount}\b", rest)]
    assert created, f"the Dockerfile does not create {mount} owned by uid {uid}"
    # The reports service serves that volume.
    reports = service(REPORTS)
    assert _named_volume_of(reports, mount) == volume
    served = reports["command"][reports["command"].index("--directory") + 1]
    assert PurePosixPath(served) == PurePosixPath(mount)


def test_data_lives_in_named_volumes_that_down_v_removes() -> None:
    declared = set(compose()["volumes"])
    used = {
        source
        for svc in compose()["services"].values()
        for v in svc.get("volumes") or []
        for source in [v.split(":")[0] if isinstance(v, str) else v.get("source", "")]
        if host_path(source) is None
    }
    assert used == declared, (
        f"declared but unused: {declared - used}; undeclared: {used - declared}"
    )
    log_dirs = environment(service(KAFKA))["KAFKA_LOG_DIRS"]
    for log_dir in log_dirs.split(","):
        assert _named_volume_of(service(KAFKA), log_dir) in declared, log_dir
    flags = dict(f.split("=", 1) for f in service(PROMETHEUS_SERVICE)["command"] if "=" in f)
    tsdb = flags["--storage.tsdb.path"]
    assert _named_volume_of(service(PROMETHEUS_SERVICE), tsdb) in declared, tsdb


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
    flags = dict(f.split("=", 1) for f in prometheus["command"] if "=" in f)
    config_file = flags["--config.file"]
    assert through_mounts(prometheus, config_file) == PROMETHEUS
    # Rule files are relative to the config file, in the container as in the repository.
    for rule_file in config.get("rule_files", []):
        inside = PurePosixPath(config_file).parent / rule_file
        on_host = through_mounts(prometheus, str(inside))
        assert on_host == PROMETHEUS_DIR / rule_file and on_host.is_file(), rule_file


# ── files ────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("path", [COMPOSE, GPU_OVERRIDE], ids=lambda p: p.name)
def test_every_mounted_file_exists(path: Path) -> None:
    mounts = [m for svc in compose(path)["services"].values() for m in bind_mounts(svc).values()]
    if path == COMPOSE:
        assert mounts, "prometheus and grafana mount files from ops/"
    for mount in mounts:
        assert mount.exists(), f"{path.name} mounts {mount}, which is not in the repository"
        assert ROOT in mount.parents, f"{mount} is outside the repository"


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


def test_dockerfile_copies_exactly_the_package_and_nothing_ignored() -> None:
    assert {"cpu", "gpu"} <= variants()
    for variant in variants():
        sources = [expand(source, VARIANT=variant) for source in copy_sources()]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not ignored(source), f"COPY {source}: excluded by .dockerignore"
        project = pyproject()
        packages = project["tool"]["setuptools"]["packages"]
        needed = {"pyproject.toml", project["project"]["readme"], f"requirements/{variant}.txt"}
        assert set(sources) == needed | set(packages), "copy what `pip install .` needs, no more"
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


def test_dependencies_are_installed_before_the_source_is_copied() -> None:
    # An edit of the source or the README must not reinstall the dependencies: everything
    # before the first COPY of a package depends on the lock alone.
    packages = set(pyproject()["tool"]["setuptools"]["packages"])
    steps = dockerfile()
    first_source = next(
        i
        for i, (kw, rest) in enumerate(steps)
        if kw == "COPY" and set(shlex.split(rest)) & packages
    )
    lock_copy = next(
        i for i, (kw, rest) in enumerate(steps) if kw == "COPY" and "requirements/" in rest
    )
    installs = [(i, rest) for i, (kw, rest) in enumerate(steps) if kw == "RUN" and " -r " in rest]
    assert installs, "no `pip install -r <lock>` step"
    for i, rest in installs:
        assert lock_copy < i < first_source, "the lock's install must come before the source"
        assert "--require-hashes" in rest and "--mount=type=cache" in rest, rest
    project_install = [rest for kw, rest in steps[first_source:] if kw == "RUN" and "/src" in rest]
    assert project_install and all("--no-deps" in rest for rest in project_install), (
        "the project itself is installed without dependencies: the lock gave the variant's"
    )


def test_dockerignore_keeps_local_state_out() -> None:
    local_state = [
        *(".venv/bin/python", ".kafka/data", ".git/HEAD", "tests/deploy/test_compose.py"),
        *(".mypy_cache/x", ".pytest_cache/x", ".ruff_cache/x", "fraud_scorer.egg-info/PKG-INFO"),
        *(".tools/bin/helm", "stream/__pycache__/cli.cpython-312.pyc"),
    ]
    for path in local_state:
        assert ignored(path), f".dockerignore lets {path} into the build context"


def test_dockerfile_runs_as_non_root_on_a_selectable_base() -> None:
    (user,) = instructions("USER")
    assert user.split(":")[0] not in ("root", "0")
    assert "BASE_IMAGE" in build_args()
    assert any(rest.startswith("${BASE_IMAGE}") for rest in instructions("FROM"))


#: The CUDA major that each onnxruntime-gpu release on PyPI links (libcudart.so.N in
#: onnxruntime/capi/libonnxruntime_providers_cuda.so: `readelf -d`), for the releases the lock
#: has held. After `make lock` moves to a release not listed, check it and add it.
ONNXRUNTIME_GPU_CUDA_MAJOR = {"1.31": 13}


def locked(variant: str) -> dict[str, str]:
    """Package name → pinned version of a lock (the last pin wins where markers split one)."""
    pins = re.findall(
        r"^([A-Za-z0-9_.-]+)==([^\s;]+)", (LOCKS / f"{variant}.txt").read_text(), re.M
    )
    return {name.lower(): version for name, version in pins}


def test_gpu_override_builds_one_cuda_image_of_the_locked_cuda_major() -> None:
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
    assert set(args) <= set(build_args()), f"build args {set(args) - set(build_args())}"
    assert args["VARIANT"] in variants()
    assert scorer["image"] != service(SCORER)["image"], "the CUDA build would overwrite the CPU tag"
    # Every service of our image runs the CUDA image: one build, not two.
    for name in our_services():
        assert merged_service(name)["image"] == scorer["image"], name
        assert merged_service(name)["build"]["args"] == args, name
    version = locked(args["VARIANT"])["onnxruntime-gpu"]
    major = ONNXRUNTIME_GPU_CUDA_MAJOR.get(".".join(version.split(".")[:2]))
    assert major is not None, f"onnxruntime-gpu {version}: which CUDA major does it link?"
    base_tag = args["BASE_IMAGE"].rsplit(":", 1)[1]
    assert base_tag.split(".")[0] == str(major), f"{args['BASE_IMAGE']} for CUDA {major}"
    assert "cudnn" in base_tag, "onnxruntime-gpu loads cuDNN at run time"


def test_the_compose_check_override_only_swaps_images() -> None:
    # make compose-check must run the stack of docker-compose.yml, not another one.
    override = yaml.safe_load(STANDINS.read_text())
    assert set(override) == {"services"}
    for name, svc in override["services"].items():
        assert name in compose()["services"], name
        assert set(svc) <= {"image", "pull_policy"}, f"{name}: {sorted(svc)}"
        assert svc["pull_policy"] == "never"


# ── packaging: ONNX Runtime per platform, locks ──────────────────────────────────────────────

#: (sys_platform, platform_machine) of the hosts users install on.
PLATFORMS = [
    ("linux", "x86_64"),
    ("linux", "aarch64"),
    ("darwin", "arm64"),
    ("darwin", "x86_64"),
    ("win32", "AMD64"),
    ("win32", "ARM64"),
]


def runtime_requirements() -> list[Requirement]:
    return [Requirement(r) for r in pyproject()["project"]["dependencies"]]


@pytest.mark.parametrize("platform", PLATFORMS, ids="-".join)
def test_exactly_one_onnx_runtime_build_installs_on_every_platform(
    platform: tuple[str, str],
) -> None:
    system, machine = platform
    environment = {"sys_platform": system, "platform_machine": machine, "python_version": "3.11"}
    chosen = [
        r.name
        for r in runtime_requirements()
        if r.name in ("onnxruntime", "onnxruntime-gpu")
        and (r.marker is None or r.marker.evaluate(environment))
    ]
    # Both install the module `onnxruntime`; together they overwrite each other's files.
    assert len(chosen) == 1, f"{platform}: {chosen}"


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_each_lock_pins_every_runtime_dependency_and_one_onnx_runtime(variant: str) -> None:
    pins = locked(variant)
    for requirement in runtime_requirements():
        if requirement.name.startswith("onnxruntime"):
            continue
        assert requirement.name in pins, f"{variant}.txt lacks {requirement.name}: make lock"
        assert requirement.specifier.contains(pins[requirement.name]), (
            f"{variant}.txt pins {requirement.name}=={pins[requirement.name]}, pyproject.toml "
            f"wants {requirement.specifier}: make lock"
        )
    runtime = {"cpu": "onnxruntime", "gpu": "onnxruntime-gpu"}[variant]
    other = {"cpu": "onnxruntime-gpu", "gpu": "onnxruntime"}[variant]
    assert runtime in pins and other not in pins, sorted(pins)
    # The project is installed without build isolation: its build backend comes from the lock.
    backend = Requirement(pyproject()["build-system"]["requires"][0])
    assert backend.specifier.contains(pins[backend.name])


# ── Grafana ──────────────────────────────────────────────────────────────────────────────────


def test_grafana_provisioning_is_mounted_and_wired_to_prometheus() -> None:
    grafana = service("grafana")
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
