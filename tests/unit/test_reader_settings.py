"""The replica's plain readers (card-state restore, compacted tables): their one tuning, and
that an operator's setting still wins over it."""

from __future__ import annotations

from stream.startup.config import ScorerSettings
from stream.startup.kafka_clients import ClientErrors, reader_settings


def test_readers_fetch_again_within_10_ms_of_a_full_queue_unless_told_otherwise() -> None:
    # librdkafka's default of 1 s kept a restore waiting most of its time (READER_DEFAULTS).
    plain = reader_settings(ScorerSettings.from_sources({}, {}), ClientErrors())
    assert plain["fetch.queue.backoff.ms"] == 10
    env = {"FRAUD_KAFKA_OPTIONS": "fetch.queue.backoff.ms=250,security.protocol=SSL"}
    tuned = reader_settings(ScorerSettings.from_sources({}, env), ClientErrors())
    assert tuned["fetch.queue.backoff.ms"] == "250"
    assert tuned["security.protocol"] == "SSL"
