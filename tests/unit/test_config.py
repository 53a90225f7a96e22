"""Configuration: defaults, precedence, and clear errors before any connection is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing.errors import ConfigurationError
from plumbing.kafka_settings import MAX_CONFIG_FILE_BYTES, read_kafka_config_file
from scorer.decisions import Thresholds
from stream.startup.cli import main
from stream.startup.config import ScorerSettings


def test_defaults_match_the_documented_contract() -> None:
    config = ScorerSettings.from_sources({}, {})
    assert (config.input_topic, config.output_topic, config.dlq_topic) == (
        "transactions",
        "decisions",
        "transactions.dlq",
    )
    assert config.group_id == "fraud-scorer"
    assert Path(config.model_path).is_dir(), "the shipped model package is the default"
    assert (config.review_threshold, config.decline_threshold) == (None, None)


def test_flag_beats_environment_beats_default() -> None:
    env = {
        "FRAUD_MAX_BATCH_SIZE": "64",
        "FRAUD_MAX_WAIT_MS": "20",
        "KAFKA_BOOTSTRAP_SERVERS": "k:1",
    }
    config = ScorerSettings.from_sources({"max_batch_size": "32"}, env)
    assert (config.max_batch_size, config.max_wait_ms, config.bootstrap_servers) == (
        32,
        20.0,
        "k:1",
    )


def test_kafka_options_pass_through_and_secrets_are_masked() -> None:
    env = {"FRAUD_KAFKA_OPTIONS": "security.protocol=SASL_SSL,sasl.password=hunter2"}
    config = ScorerSettings.from_sources({}, env)
    assert config.kafka_options["security.protocol"] == "SASL_SSL"
    assert config.redacted_kafka_settings()["sasl.password"] == "***"
    assert "hunter2" not in repr(config.redacted_kafka_settings())


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
        ({"FRAUD_REVIEW_THRESHOLD": "1.5"}, "review_threshold must be between 0 and 1, got 1.5"),
        ({"FRAUD_OUTPUT_TOPIC": "transactions"}, "three different topics"),
        ({"FRAUD_MODEL_PATH": "/nonexistent/model"}, "is not a model package directory"),
        ({"FRAUD_KAFKA_OPTIONS": "novalue"}, "KEY=VALUE"),
        ({"FRAUD_METRICS_PORT": "70000"}, "metrics_port"),
        (
            {"FRAUD_INPUT_FORMAT": "thrift"},
            "input_format must be one of avro, json, json-schema, protobuf",
        ),
        ({"FRAUD_INPUT_FORMAT": "avro"}, "Schema Registry wire format: set schema_registry_url"),
        ({"FRAUD_INPUT_MAPPING": "/nonexistent/mapping.toml"}, "cannot read input mapping"),
        (
            {"FRAUD_WAIT_FOR_WORKER": "yes"},
            "FRAUD_WAIT_FOR_WORKER: wait_for_worker must be one of off, on, got 'yes'",
        ),
    ],
)
def test_bad_settings_name_the_setting_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message.replace(".", r"\.")):
        ScorerSettings.from_sources({}, env)


def test_wrong_type_in_code_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="max_batch_size"):
        ScorerSettings(max_batch_size="8")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model_path"):
        ScorerSettings(model_path=Path("/tmp"))  # type: ignore[arg-type]


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


def test_model_path_is_a_package_directory_or_an_mlflow_model(tmp_path: Path) -> None:
    def model_path(value: str) -> str:
        return ScorerSettings.from_sources({}, {"FRAUD_MODEL_PATH": value}).model_path

    assert model_path(str(tmp_path)) == str(tmp_path)
    assert model_path("models:/fraud@champion") == "models:/fraud@champion"
    assert model_path("models:/fraud/3") == "models:/fraud/3"
    with pytest.raises(ConfigurationError, match="not a model package directory"):
        model_path(str(tmp_path / "model.onnx"))
    with pytest.raises(ConfigurationError, match=r"not models:/<name>@<alias> nor"):
        model_path("models:/fraud")
    shadow = {"FRAUD_SHADOW_MODEL": "models:/fraud@challenger/extra"}
    with pytest.raises(ConfigurationError, match="not models:/<name>@<alias>"):
        ScorerSettings.from_sources({}, shadow)


def test_thresholds_default_to_the_packages_and_each_may_be_set() -> None:
    package = Thresholds(0.3, 0.9)
    assert ScorerSettings.from_sources({}, {}).decision_policy(package).thresholds == package
    env = {"FRAUD_DECLINE_THRESHOLD": "0.7"}
    policy = ScorerSettings.from_sources({}, env).decision_policy(package)
    assert policy.thresholds == Thresholds(0.3, 0.7)
    crossing = ScorerSettings.from_sources({}, {"FRAUD_REVIEW_THRESHOLD": "0.95"})
    with pytest.raises(ConfigurationError, match=r"review <= decline, got review 0\.95 and decl"):
        crossing.decision_policy(package)


def test_only_settings_known_to_be_safe_are_logged_in_clear(tmp_path: Path) -> None:
    # Finding 8 of the review: a deny-list missed sasl.oauthbearer.config, which can hold a
    # client secret.
    env = {
        "FRAUD_KAFKA_OPTIONS": "security.protocol=SASL_SSL,sasl.oauthbearer.config=clientSecret=s3",
    }
    shown = ScorerSettings.from_sources({}, env).redacted_kafka_settings()
    assert shown == {"security.protocol": "SASL_SSL", "sasl.oauthbearer.config": "***"}


def test_a_comma_inside_a_value_does_not_cut_it_and_errors_never_echo_values() -> None:
    env = {"FRAUD_KAFKA_OPTIONS": "sasl.username=svc,sasl.password=a,b=c,d;e,acks=all"}
    options = ScorerSettings.from_sources({}, env).kafka_options
    assert options == {"sasl.username": "svc", "sasl.password": "a,b=c,d;e", "acks": "all"}
    with pytest.raises(ConfigurationError) as caught:
        ScorerSettings.from_sources({}, {"FRAUD_KAFKA_OPTIONS": "hunter2-no-equals-sign"})
    assert "hunter2" not in str(caught.value)


def test_settings_from_a_properties_file_are_overridden_by_options(tmp_path: Path) -> None:
    secrets = tmp_path / "kafka.properties"
    secrets.write_text(
        "# mounted from a secret\n"
        "security.protocol = SASL_SSL\n"
        "sasl.password=p,with=commas\n"
        "\n"
        "acks=1\n"
    )
    config = ScorerSettings.from_sources(
        {"kafka_config_file": str(secrets)}, {"FRAUD_KAFKA_OPTIONS": "acks=all"}
    )
    assert config.kafka_settings() == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "p,with=commas",
        "acks": "all",
    }
    assert "p,with=commas" not in repr(config.redacted_kafka_settings())


def test_schema_registry_settings_come_from_the_same_file_and_never_reach_librdkafka(
    tmp_path: Path,
) -> None:
    secrets = tmp_path / "kafka.properties"
    secrets.write_text(
        "sasl.password=kafka-secret\n"
        "schema.registry.basic.auth.user.info=team:registry-secret\n"
        "schema.registry.ssl.ca.location=/etc/ca.pem\n"
    )
    config = ScorerSettings.from_sources(
        {"kafka_config_file": str(secrets)},
        {"FRAUD_INPUT_FORMAT": "avro", "FRAUD_SCHEMA_REGISTRY_URL": "https://registry:8081"},
    )
    assert config.kafka_settings() == {"sasl.password": "kafka-secret"}
    assert config.registry_settings() == {
        "url": "https://registry:8081",
        "basic.auth.user.info": "team:registry-secret",
        "ssl.ca.location": "/etc/ca.pem",
    }


def test_a_missing_or_malformed_config_file_stops_the_cli_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.properties"
    bad.write_text("sasl.password\n")
    for path in (tmp_path / "missing.properties", bad):
        code = main(["run", "--kafka-config-file", str(path), "--bootstrap-servers", "127.0.0.1:1"])
        assert code == 2
        err = capsys.readouterr().err
        assert "kafka config file" in err and "sasl.password" not in err.split(":", 1)[0]


def test_a_config_file_past_its_bound_is_refused_before_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = tmp_path / "huge.properties"
    with huge.open("wb") as file:  # sparse: the size on disk says it all, nothing is read
        file.truncate(MAX_CONFIG_FILE_BYTES + 1)
    with pytest.raises(ConfigurationError, match=r"larger than 1,048,576 bytes"):
        read_kafka_config_file(huge)
    undecodable = tmp_path / "latin1.properties"
    undecodable.write_bytes(b"sasl.password=caf\xe9\n")
    with pytest.raises(ConfigurationError, match="cannot read kafka config file"):
        read_kafka_config_file(undecodable)
    code = main(["run", "--kafka-config-file", str(huge), "--bootstrap-servers", "127.0.0.1:1"])
    assert code == 2 and "larger than" in capsys.readouterr().err


def test_a_rules_file_that_cannot_be_used_stops_the_start(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nname = "x"\nwhen = "__import__(\'os\')"\nthen = "review"\n')
    with pytest.raises(ConfigurationError, match=r"rules\.toml"):
        ScorerSettings.from_sources({}, {"FRAUD_RULES": str(rules)})
    with pytest.raises(ConfigurationError, match="rules_topic must be a topic of its own"):
        ScorerSettings.from_sources({}, {"FRAUD_RULES_TOPIC": "transactions"})
