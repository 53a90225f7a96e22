"""The compose `features` service agrees with fraud-features: its command parses, it sets only
variables the worker reads (with values the worker accepts), it starts after the topics, and its
health check reads the worker's metrics port. Nothing here needs Docker."""

from __future__ import annotations

from terminals import cli as features_cli
from terminals.config import FeaturesSettings
from tests.deploy.compose_file import KAFKA, SCORER, TOPICS, environment, our_services, service
from tests.deploy.repo import pyproject

FEATURES = "features"


def test_the_features_worker_runs_from_our_image_with_its_console_script() -> None:
    features = our_services()[FEATURES]
    assert features["image"] == service(SCORER)["image"]
    (program,) = features["entrypoint"]
    assert pyproject()["project"]["scripts"][program] == "terminals.cli:main"
    args = features_cli.build_parser().parse_args(features["command"])
    assert args.command == "run"


def test_it_sets_only_variables_the_worker_reads_with_valid_values() -> None:
    env = environment(service(FEATURES))
    known = {setting.env for setting in FeaturesSettings.settings()}
    unknown = {k for k in env if k.startswith(("FRAUD_", "KAFKA_"))} - known
    assert not unknown, f"features sets {sorted(unknown)}, which terminals/config.py never reads"
    config = FeaturesSettings.from_sources({}, env)
    assert config.bootstrap_servers == environment(service(SCORER))["KAFKA_BOOTSTRAP_SERVERS"]
    assert config.input_topic == environment(service(SCORER))["FRAUD_INPUT_TOPIC"]
    assert config.dlq_topic == environment(service(SCORER))["FRAUD_DLQ_TOPIC"]


def test_it_starts_after_the_topics_and_its_health_check_reads_its_metrics() -> None:
    features = service(FEATURES)
    assert features["depends_on"][KAFKA]["condition"] == "service_healthy"
    assert features["depends_on"][TOPICS]["condition"] == "service_completed_successfully"
    port = FeaturesSettings.from_sources({}, environment(features)).metrics_port
    assert port and str(port) in {str(p) for p in features.get("expose", [])}
    assert f"127.0.0.1:{port}/healthz" in " ".join(features["healthcheck"]["test"])
    assert not features.get("profiles"), "the worker starts with a plain `up`"
