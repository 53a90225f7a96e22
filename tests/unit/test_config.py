"""Configuration: defaults, precedence, and clear errors before any connection is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import ConfigurationError
from stream.cli import main
from stream.config import ServiceConfig


def test_defaults_match_the_documented_contract() -> None:
    config = ServiceConfig.from_sources({}, {})
    assert (config.input_topic, config.output_topic, config.dlq_topic) == (
        "transactions",
        "decisions",
        "transactions.dlq",
    )
    assert config.group_id == "fraud-scorer"
    assert config.model_path.is_file(), "the shipped model is the default"


def test_flag_beats_environment_beats_default() -> None:
    env = {
        "FRAUD_MAX_BATCH_SIZE": "64",
        "FRAUD_MAX_WAIT_MS": "20",
        "KAFKA_BOOTSTRAP_SERVERS": "k:1",
    }
    config = ServiceConfig.from_sources({"max_batch_size": "32"}, env)
    assert (config.max_batch_size, config.max_wait_ms, config.bootstrap_servers) == (
        32,
        20.0,
        "k:1",
    )


def test_kafka_options_pass_through_and_secrets_are_masked() -> None:
    env = {"FRAUD_KAFKA_OPTIONS": "security.protocol=SASL_SSL,sasl.password=hunter2"}
    config = ServiceConfig.from_sources({}, env)
    assert config.kafka_options["security.protocol"] == "SASL_SSL"
    assert config.redacted_kafka_options()["sasl.password"] == "***"
    assert "hunter2" not in repr(config.redacted_kafka_options())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"FRAUD_MAX_BATCH_SIZE": "many"},
            "FRAUD_MAX_BATCH_SIZE: max_batch_size must be an integer in 1..65536, got 'many'",
        ),
        ({"FRAUD_MAX_BATCH_SIZE": "0"}, "max_batch_size must be an integer in 1..65536, got '0'"),
        ({"FRAUD_MAX_WAIT_MS": "-1"}, "max_wait_ms"),
        ({"FRAUD_DEVICE": "tpu"}, "device must be one of auto, cpu, cuda, tensorrt, got 'tpu'"),
        ({"FRAUD_REVIEW_THRESHOLD": "0.9", "FRAUD_DECLINE_THRESHOLD": "0.5"}, "review_threshold"),
        ({"FRAUD_OUTPUT_TOPIC": "transactions"}, "three different topics"),
        ({"FRAUD_MODEL_PATH": "/nonexistent/model.onnx"}, "is not a file"),
        ({"FRAUD_KAFKA_OPTIONS": "novalue"}, "KEY=VALUE"),
        ({"FRAUD_METRICS_PORT": "70000"}, "metrics_port"),
    ],
)
def test_bad_settings_name_the_setting_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace(".", r"\.")):
        ServiceConfig.from_sources({}, env)


def test_wrong_type_in_code_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="max_batch_size"):
        ServiceConfig(max_batch_size="8")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model_path"):
        ServiceConfig(model_path="model.onnx")  # type: ignore[arg-type]


def test_cli_rejects_bad_configuration_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # An unreachable broker would hang a client; the bad value must stop us first.
    code = main(["run", "--bootstrap-servers", "127.0.0.1:1", "--max-batch-size", "0"])
    assert code == 2
    assert "max_batch_size must be an integer in 1..65536, got '0'" in capsys.readouterr().err


def test_cli_help_documents_every_option_with_env_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for env in (
        "KAFKA_BOOTSTRAP_SERVERS",
        "FRAUD_MAX_BATCH_SIZE",
        "FRAUD_MAX_WAIT_MS",
        "FRAUD_METRICS_PORT",
        "FRAUD_INPUT_TOPIC",
        "FRAUD_OUTPUT_TOPIC",
        "FRAUD_DLQ_TOPIC",
        "FRAUD_GROUP_ID",
    ):
        assert f"env {env};" in text
    assert "default: 256" in text


def test_model_path_from_environment_is_a_path(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"x")
    assert ServiceConfig.from_sources({}, {"FRAUD_MODEL_PATH": str(model)}).model_path == model
