"""The service's configuration: one typed, frozen object, loaded once at start-up.

A setting is one declaration in `stream/startup/flow_options.py`,
`stream/startup/decision_input_options.py` or `stream/startup/options.py` (or, for those every
service shares, `plumbing/settings.py`): its name, type and bounds (`Annotated[…, meta(…)]`), its
environment variable, its help and its default. `plumbing/settings.py` converts and checks values
from flags and the environment (`from_sources`) and values given in code; `__post_init__` here adds
only the checks that involve several settings. `fraud-scorer run --help`, the reference pages and
the deploy checks read the same declarations (`ScorerSettings.settings()`), so help, environment
names and code cannot drift apart. Extra librdkafka settings (security, SASL, SSL, tuning) pass
through unchanged in `kafka_options` and the file `kafka_config_file`; see
`plumbing/kafka_settings.py`.
"""

from __future__ import annotations

from contracts.field_mapping import FieldMapping
from plumbing.errors import ConfigurationError
from scorer.decide import DecisionPolicy
from scorer.decisions import Thresholds
from scorer.model_source import check_model_location
from scorer.rules import Rules
from stream.startup.options import SHIPPED_MODEL_PATH, ScorerOptions

__all__ = ["SHIPPED_MODEL_PATH", "ScorerSettings"]


#: Settings of the config file and kafka_options that are the Schema Registry client's.
REGISTRY_PREFIX = "schema.registry."


class ScorerSettings(ScorerOptions, frozen=True, kw_only=True):
    """All settings of `fraud-scorer run`. Construct it directly or with `from_sources()`.

    Direct construction checks every value too: a wrong type raises TypeError, a value out of
    its bounds or inconsistent with another raises ValueError, naming the setting.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if len({self.input_topic, self.output_topic, self.dlq_topic}) != 3:
            raise ValueError(
                "input_topic, output_topic and dlq_topic must be three different topics, got "
                f"{self.input_topic!r}, {self.output_topic!r}, {self.dlq_topic!r}"
            )
        for name in ("review_threshold", "decline_threshold"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        if self.max_in_flight_records < self.max_batch_size:
            raise ValueError(
                f"max_in_flight_records must be >= max_batch_size ({self.max_batch_size}), "
                f"got {self.max_in_flight_records}"
            )
        if self.slo_ms and self.min_batch_size > self.max_batch_size:
            raise ValueError(
                f"min_batch_size must be <= max_batch_size ({self.max_batch_size}) when the "
                f"adaptive cap is on (slo_ms > 0), got {self.min_batch_size}"
            )
        if self.retry_backoff_ms > self.retry_backoff_max_ms:
            raise ValueError(
                "retry backoffs must satisfy retry_backoff_ms <= retry_backoff_max_ms, got "
                f"{self.retry_backoff_ms} and {self.retry_backoff_max_ms}"
            )
        check_model_location(self.model_path, "model_path")
        if self.shadow_model is not None:
            check_model_location(self.shadow_model, "shadow_model")
        for key in self.kafka_options:
            if key in ("bootstrap.servers", "group.id"):
                raise ValueError(f"set {key} with its own option, not in kafka_options")
        if self.input_mapping is not None:
            FieldMapping.load(self.input_mapping)  # a bad file stops the start, naming the key
        if self.rules is not None:
            Rules.load(self.rules)  # likewise
        others = (
            self.input_topic,
            self.output_topic,
            self.dlq_topic,
            self.terminal_risk_topic,
            self.card_frauds_topic,
        )
        if self.rules_topic in (*others, self.changelog_topic):
            raise ValueError(f"rules_topic must be a topic of its own, got {self.rules_topic!r}")
        if self.observed_precision == "on" and self.labels_topic in (*others, self.rules_topic):
            raise ValueError(
                f"labels_topic must be the topic of confirmed outcomes, got {self.labels_topic!r}"
            )
        if (self.input_format == "protobuf") != (self.input_protobuf_message is not None):
            raise ValueError(
                "input_format protobuf and input_protobuf_message (FRAUD_INPUT_PROTOBUF_MESSAGE, "
                "module:Class) go together"
            )
        if self.schema_registry_subjects is not None and not all(
            subject.strip() == subject and subject
            for subject in self.schema_registry_subjects.split(",")
        ):
            raise ValueError(
                "schema_registry_subjects (FRAUD_SCHEMA_REGISTRY_SUBJECTS) must be subjects "
                f"separated by commas, got {self.schema_registry_subjects!r}"
            )
        for name, value in (
            ("input_format", self.input_format),
            ("output_format", self.output_format),
        ):
            if value != "json" and not self.schema_registry_url:
                raise ValueError(
                    f"{name} {value} is the Schema Registry wire format: set "
                    "schema_registry_url (FRAUD_SCHEMA_REGISTRY_URL)"
                )

    def kafka_settings(self) -> dict[str, str]:
        """librdkafka settings beyond the service's own: the config file, then kafka_options,
        without the Schema Registry's.

        Raises ConfigurationError when the file cannot be read or parsed."""
        for key in ("bootstrap.servers", "group.id"):
            if key in self.kafka_file_settings():
                raise ConfigurationError(
                    f"kafka config file sets {key}: set it with its own option instead"
                )
        merged = super().kafka_settings()
        return {k: v for k, v in merged.items() if not k.startswith(REGISTRY_PREFIX)}

    def registry_settings(self) -> dict[str, str]:
        """The Schema Registry client's settings: the URL, and the `schema.registry.*` keys of
        the config file and kafka_options without their prefix (credentials:
        `schema.registry.basic.auth.user.info`, `schema.registry.bearer.auth.token`; TLS:
        `schema.registry.ssl.ca.location`), as Confluent's clients read them."""
        merged = super().kafka_settings()
        settings = {
            k[len(REGISTRY_PREFIX) :]: v for k, v in merged.items() if k.startswith(REGISTRY_PREFIX)
        }
        if self.schema_registry_url:
            settings["url"] = self.schema_registry_url
        return settings

    @property
    def schema_subjects(self) -> tuple[str, ...]:
        """The subjects a writer schema must be registered under (FRAUD_SCHEMA_REGISTRY_SUBJECTS,
        or the input topic's own)."""
        if self.schema_registry_subjects is None:
            return (f"{self.input_topic}-value",)
        return tuple(self.schema_registry_subjects.split(","))

    @property
    def changelog_topic(self) -> str:
        """The compacted topic of the card histories."""
        return self.state_changelog_topic or f"{self.group_id}-card-state-changelog"

    @property
    def shadow_output_topic(self) -> str:
        """Where the challenger's shadow decisions go (FRAUD_SHADOW_MODEL)."""
        return self.shadow_topic or f"{self.output_topic}.shadow"

    @property
    def exactly_once(self) -> bool:
        """Whether outputs and offsets commit in Kafka transactions."""
        return self.processing_guarantee == "exactly-once"

    @property
    def producer_transactional_id(self) -> str:
        """The transactional.id of this replica's producer (exactly-once)."""
        return self.transactional_id or f"{self.group_id}-{self.instance_id}"

    def decision_policy(self, package: Thresholds) -> DecisionPolicy:
        """How scores become decisions: the thresholds set here, else the model package's
        (`package`), and the late policy. ConfigurationError when they cross."""
        thresholds = Thresholds(
            package.review if self.review_threshold is None else self.review_threshold,
            package.decline if self.decline_threshold is None else self.decline_threshold,
        )
        if thresholds.review > thresholds.decline:
            raise ConfigurationError(
                "thresholds must satisfy review <= decline, got review "
                f"{thresholds.review} and decline {thresholds.decline} (FRAUD_REVIEW_THRESHOLD, "
                "FRAUD_DECLINE_THRESHOLD, or the model package's model.toml [thresholds])"
            )
        return DecisionPolicy(thresholds, self.decision_deadline_ms, self.late_policy)
