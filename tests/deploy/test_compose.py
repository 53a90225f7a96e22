"""The compose files agree with the code: docker-compose.yml, docker-compose.gpu.yml and the
compose-check override (the image they run: test_image.py).

Nothing here needs Docker: the files are parsed and checked against what the code declares
(ScorerSettings's and fraud-loadgen's settings and their environment variables, fraud-loadgen's
parser, the console scripts, packages and package data of pyproject.toml). Compose
interpolation (`${NAME:-default}`) is resolved to its default, as on a machine with no .env.
`make compose-check` runs the stack itself.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from loadgen import options as loadgen_options
from loadgen.options import LoadgenSettings
from stream.startup import cli as scorer_cli
from stream.startup.config import ScorerSettings
from tests.deploy.compose_file import (
    COMPOSE,
    GPU_OVERRIDE,
    KAFKA,
    LOADGEN,
    PROMETHEUS_SERVICE,
    REPORTS,
    SCORER,
    STANDINS,
    TOPICS,
    bind_mounts,
    compose,
    environment,
    host_path,
    merged_service,
    metrics_port,
    our_services,
    raw_compose,
    service,
    through_mounts,
)
from tests.deploy.repo import (
    DASHBOARD,
    DOCKERFILE,
    GRAFANA,
    PROMETHEUS,
    PROMETHEUS_DIR,
    ROOT,
    build_args,
    config_default,
    config_envs,
    dashboard_targets,
    exec_form,
    instructions,
    locked,
    pyproject,
    variants,
)

README = ROOT / "README.md"


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
    assert not unknown, f"{name} sets {sorted(unknown)}, which stream/startup/config.py never reads"
    # The values are valid too: the same parsing and validation as `fraud-scorer run`.
    ScorerSettings.from_sources({}, env)


def test_loadgen_sets_only_variables_it_reads_with_valid_values() -> None:
    env = environment(service(LOADGEN))
    assert env, "loadgen needs at least the bootstrap servers and topics"
    unread = set(env) - {setting.env for setting in LoadgenSettings.settings()}
    assert not unread, f"loadgen sets {sorted(unread)}, which loadgen/options.py never reads"
    LoadgenSettings.from_sources({}, env)


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
    loadgen_options.build_parser().parse_args([*flags, *loadgen.get("command", [])])


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
    assert ScorerSettings().instance_id.startswith("c0ffee123456")


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
    docs = (README, ROOT / "docs" / "compose.md", ROOT / "docs" / "getting-started.md")
    for path in (*docs, COMPOSE, GPU_OVERRIDE, ROOT / "ops" / "compose" / "check.sh"):
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
    args = loadgen_options.build_parser().parse_args(argv[1:])
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
        assert on_host is not None and on_host == PROMETHEUS_DIR / rule_file, rule_file
        assert on_host.is_file(), rule_file


# ── files ────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("path", [COMPOSE, GPU_OVERRIDE], ids=lambda p: p.name)
def test_every_mounted_file_exists(path: Path) -> None:
    mounts = [m for svc in compose(path)["services"].values() for m in bind_mounts(svc).values()]
    if path == COMPOSE:
        assert mounts, "prometheus and grafana mount files from ops/"
    for mount in mounts:
        assert mount.exists(), f"{path.name} mounts {mount}, which is not in the repository"
        assert ROOT in mount.parents, f"{mount} is outside the repository"


#: The CUDA major that each onnxruntime-gpu release on PyPI links (libcudart.so.N in
#: onnxruntime/capi/libonnxruntime_providers_cuda.so: `readelf -d`), for the releases the lock
#: has held. After `make lock` moves to a release not listed, check it and add it.
ONNXRUNTIME_GPU_CUDA_MAJOR = {"1.31": 13}


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
    ScorerSettings.from_sources({}, env)
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
