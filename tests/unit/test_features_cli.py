"""`fraud-features`' settings (terminals/config.py), the security settings it maps onto faust's
client (terminals/kafka_auth.py) and its command line (terminals/cli.py): no Kafka, no faust
worker started."""

from __future__ import annotations

import ssl
import sys
from pathlib import Path

import pytest
from faust.auth import SASLCredentials, SSLCredentials

from plumbing.errors import ConfigurationError
from terminals import cli
from terminals.config import FeaturesSettings
from terminals.kafka_auth import faust_kafka_auth


def test_defaults_match_the_scorers_topics_and_a_real_day() -> None:
    config = FeaturesSettings.from_sources({}, {})
    assert (config.input_topic, config.labels_topic, config.dlq_topic) == (
        "transactions",
        "labels",
        "transactions.dlq",
    )
    assert (config.terminal_risk_topic, config.app_id) == ("terminal-risk", "fraud-features")
    assert config.day_ms == 86_400_000
    assert config.service == f"fraud-features/{config.instance_id}"


def test_environment_then_flags() -> None:
    env = {
        "FRAUD_LABELS_TOPIC": "outcomes",
        "FRAUD_FEATURES_TABLE_PARTITIONS": "4",
        "FRAUD_HISTORY_TIME_SCALE": "27000",
        "FRAUD_FEATURES_APP_ID": "ff-env",
    }
    config = FeaturesSettings.from_sources({"app_id": "ff-flag"}, env)
    assert (config.labels_topic, config.table_partitions, config.app_id) == (
        "outcomes",
        4,
        "ff-flag",
    )
    assert config.day_ms == round(86_400_000 / 27_000)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ({"table_partitions": "0"}, "--table-partitions (FRAUD_FEATURES_TABLE_PARTITIONS)"),
        ({"table_partitions": "many"}, "--table-partitions"),
        ({"history_time_scale": "0"}, "--history-time-scale (FRAUD_HISTORY_TIME_SCALE)"),
        ({"labels_topic": "bad topic"}, "--labels-topic (FRAUD_LABELS_TOPIC)"),
        ({"auto_offset_reset": "middle"}, "--auto-offset-reset"),
        ({"session_timeout_s": "1"}, "--session-timeout-s"),
        ({"metrics_port": "70000"}, "--metrics-port"),
        ({"log_level": "LOUD"}, "--log-level (FRAUD_LOG_LEVEL)"),
    ],
)
def test_bad_settings_name_the_flag_and_the_variable(flags: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named.replace("(", r"\(").replace(")", r"\)")):
        FeaturesSettings.from_sources(flags, {})


def test_kafka_settings_come_from_the_file_then_the_options(tmp_path: Path) -> None:
    properties = tmp_path / "kafka.properties"
    properties.write_text("security.protocol=SASL_SSL\nsasl.password=secret\n")
    env = {"FRAUD_KAFKA_CONFIG_FILE": str(properties), "FRAUD_KAFKA_OPTIONS": "linger.ms=5"}
    config = FeaturesSettings.from_sources({}, env)
    assert config.kafka_settings() == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "secret",
        "linger.ms": "5",
    }
    assert config.redacted_kafka_settings()["sasl.password"] == "***"
    flags_win = FeaturesSettings.from_sources({"kafka_options": ["security.protocol=SSL"]}, env)
    assert flags_win.kafka_settings()["security.protocol"] == "SSL"
    assert "linger.ms" not in flags_win.kafka_settings()


# ── security settings → faust/aiokafka ───────────────────────────────────────────────────────


def test_plaintext_needs_no_credentials_and_names_what_it_does_not_apply() -> None:
    assert faust_kafka_auth({}) == (None, ())
    auth = faust_kafka_auth({"linger.ms": "5", "client.id": "x"})
    assert auth.credentials is None and auth.ignored == ("client.id", "linger.ms")


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_maps_onto_faust_sasl_credentials(mechanism: str) -> None:
    auth = faust_kafka_auth(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": mechanism,
            "sasl.username": "svc",
            "sasl.password": "pw",
        }
    )
    credentials = auth.credentials
    assert isinstance(credentials, SASLCredentials)
    assert (credentials.username, credentials.password) == ("svc", "pw")
    assert credentials.mechanism.value == mechanism
    assert credentials.ssl_context is None


def test_sasl_ssl_carries_a_verifying_tls_context() -> None:
    auth = faust_kafka_auth(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "svc",
            "sasl.password": "pw",
        }
    )
    assert isinstance(auth.credentials, SASLCredentials)
    context = auth.credentials.ssl_context
    assert context is not None and context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_ssl_verification_can_be_relaxed_as_in_librdkafka() -> None:
    auth = faust_kafka_auth(
        {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "none"}
    )
    assert isinstance(auth.credentials, SSLCredentials)
    assert not auth.credentials.context.check_hostname
    assert auth.credentials.context.verify_mode == ssl.CERT_REQUIRED
    off = faust_kafka_auth(
        {"security.protocol": "ssl", "enable.ssl.certificate.verification": "false"}
    )
    assert isinstance(off.credentials, SSLCredentials)
    assert off.credentials.context.verify_mode == ssl.CERT_NONE


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"security.protocol": "KERBEROS"}, "security.protocol must be"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "svc"}, "sasl.password"),
        ({"ssl.keystore.location": "/k.p12", "ssl.keystore.password": "hunter2"}, "keystore"),
        ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"}, "SSL files"),
        ({"security.protocol": "SSL", "enable.ssl.certificate.verification": "no"}, "true or"),
    ],
)
def test_what_cannot_be_applied_stops_the_worker(settings: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        faust_kafka_auth(settings)
    assert "hunter2" not in str(raised.value)


# ── the command line ─────────────────────────────────────────────────────────────────────────


def test_help_documents_every_option_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("run", "create-topics"):
        with pytest.raises(SystemExit) as exited:
            cli.main([command, "--help"])
        assert exited.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        for setting in FeaturesSettings.settings():
            assert all(flag in text for flag in setting.flags)
            assert setting.env in text
        for variable in ("FRAUD_KAFKA_OPTIONS", "FRAUD_KAFKA_CONFIG_FILE", "-X KEY=VALUE"):
            assert variable in text


def test_bad_configuration_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--table-partitions", "0"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("fraud-features: configuration error: --table-partitions")
    assert len(err.strip().splitlines()) == 1


def test_a_missing_faust_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "faust.worker", None)  # import faust.worker fails
    assert cli.run_worker(FeaturesSettings()) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "faust-streaming is not installed" in err and "pip install" in err
