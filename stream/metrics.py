"""The small methods the rest of the code calls to update the scorer's metrics: `ServiceMetrics`,
the one object the code is handed. Each method says what happened (a batch recorded, a model in
use, partitions paused) and updates the metrics that count it.

The metrics themselves (names, help texts, buckets) are defined in stream/metric_definitions.py,
which `ServiceMetrics` extends, updating the metrics that module publishes: the catalogue that
dashboards, alerts and docs/metrics.md rely on reads in one place, apart from the code that
updates it. No other module of stream/ but stream/batch_histogram.py (a collector) touches
prometheus_client.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from stream.metric_definitions import MetricDefinitions


class ServiceMetrics(MetricDefinitions):
    """The service's metrics on one registry, and what the code records in them."""

    def record_consumed(self, count: int) -> None:
        self.consumed.inc(count)

    def count_delivered(self, labels: Mapping[tuple[str, str], int]) -> None:
        """Count a completed outcome group's outputs: ("decision", label) or
        ("dead_letter", reason)."""
        for (kind, label), count in labels.items():
            if kind == "decision":
                self.decisions.labels(label).inc(count)
            elif kind == "dead_letter":
                self.dead_letters.labels(label).inc(count)

    def record_batch(self, size: int, wait_s: float, inference_s: float) -> None:
        self.batch_size.observe(size)
        self.batch_wait.observe(wait_s)
        self.inference.observe(inference_s)

    def observe_stages(self, seconds: Mapping[str, float]) -> None:
        for stage, value in seconds.items():
            self.stage.labels(stage).observe(value)

    def observe_event_to_decision(self, latencies_s: npt.NDArray[np.floating[Any]]) -> None:
        self.event_to_decision.observe_many(latencies_s)

    def set_in_flight(self, count: int, size_bytes: int) -> None:
        self.in_flight.set(count)
        self.in_flight_bytes.set(size_bytes)

    def set_model(
        self,
        model_version: str,
        provider: str,
        expected_flag_rate: tuple[float, float] | None = None,
    ) -> None:
        """The model now in use (the one before, if any, is no longer shown), and the flag-rate
        range it expects (None: unknown)."""
        self.model.clear()
        self.provider.clear()
        self.model.labels(model_version).set(1)
        self.provider.labels(provider).set(1)
        low, high = expected_flag_rate or (math.nan, math.nan)
        self.expected_flag_rate.labels("low").set(low)
        self.expected_flag_rate.labels("high").set(high)

    def set_history_time_scale(self, scale: float) -> None:
        self.history_time_scale.set(scale)

    def count_model_reload(self, role: str, result: str) -> None:
        self.model_reloads.labels(role, result).inc()

    def count_model_rollback(self) -> None:
        self.model_rollbacks.inc()

    def set_drift(self, psi: Mapping[str, float]) -> None:
        """The latest window's PSI: key "score", and one per drift feature."""
        for name, value in psi.items():
            if name == "score":
                self.score_psi.set(value)
            else:
                self.feature_psi.labels(name).set(value)

    def count_flagged_outcomes(self, outcome: str, n: int) -> None:
        self.flagged_outcomes.labels(outcome).inc(n)

    def set_flagged_pending(self, n: int) -> None:
        self.flagged_pending.set(n)

    def count_flagged_untracked(self, n: int) -> None:
        self.flagged_untracked.inc(n)

    def clear_drift(self) -> None:
        """No PSI to show (a new model, whose first window is not complete)."""
        self.score_psi.set(0.0)
        self.feature_psi.clear()

    def observe_scores(self, scores: npt.NDArray[np.floating[Any]]) -> None:
        self.scores.observe_many(scores)

    def record_shadow(
        self, scores: npt.NDArray[np.floating[Any]], pairs: Mapping[tuple[str, str], int]
    ) -> None:
        """The challenger's scores, and (served label, shadow label) counts."""
        self.shadow_scores.observe_many(scores)
        for (served, shadow), count in pairs.items():
            self.shadow_decisions.labels(served, shadow).inc(count)

    def record_shadow_failure(self) -> None:
        self.shadow_failures.inc()

    def count_shadow_dropped(self, reason: str, count: int = 1) -> None:
        """Shadow records not written: busy, late or refused (stream/shadow.py)."""
        self.shadow_dropped.labels(reason).inc(count)

    def set_paused_partitions(self, count: int) -> None:
        self.paused.set(count)

    def set_held_partitions(self, count: int) -> None:
        self.held.set(count)

    def waited_for_worker(self, seconds: float) -> None:
        self.worker_wait.inc(seconds)

    def set_consumer_lag(self, topic: str, partition: int, lag: int) -> None:
        self.consumer_lag.labels(topic, str(partition)).set(lag)

    def forget_consumer_lag(self, topic: str, partition: int) -> None:
        with contextlib.suppress(KeyError):
            self.consumer_lag.remove(topic, str(partition))

    def set_time_lag(self, seconds: float) -> None:
        self.time_lag.set(seconds)

    def set_batch_cap(self, cap: int, direction: str | None = None) -> None:
        self.batch_cap.set(cap)
        if direction is not None:
            self.batch_cap_changes.labels(direction).inc()

    def observe_reasons(self, seconds: float) -> None:
        self.reasons.observe(seconds)

    def record_rule_hits(self, counts: Mapping[str, int]) -> None:
        for rule, count in counts.items():
            self.rule_hits.labels(rule).inc(count)

    def record_rules_update(self, result: str) -> None:
        self.rules_updates.labels(result).inc()

    def set_rules_entries(self, entries: int) -> None:
        self.rules_entries.set(entries)

    def record_late(self, count: int) -> None:
        self.late.inc(count)

    def record_degraded(self, cause: str, count: int) -> None:
        self.degraded.labels(cause).inc(count)

    def record_delivery_retry(self, cause: str) -> None:
        self.retries.labels(cause).inc()

    def record_dead_letter_produce_failure(self, cause: str) -> None:
        self.dead_letter_failures.labels(cause).inc()

    def set_delivery_stalled(self, stalled: bool) -> None:
        self.stalled.set(1 if stalled else 0)

    def record_producer_replaced(self) -> None:
        self.producer_replacements.inc()

    def record_poison(self, count: int) -> None:
        self.poison.inc(count)

    def observe_state_restore(self, read: str, seconds: float, changelog_records: int) -> None:
        self.restore.labels(read).observe(seconds)
        self.restore_records.labels(read).inc(changelog_records)

    def set_kept_partitions(self, count: int) -> None:
        self.kept.set(count)

    def set_restoring_partitions(self, count: int) -> None:
        self.restoring.set(count)

    def record_event_time_out_of_bounds(self, reason: str, count: int) -> None:
        self.out_of_bounds.labels(reason).inc(count)

    def record_state_rollback(self, method: str) -> None:
        self.rollbacks.labels(method).inc()

    def set_card_state(self, cards: int, size_bytes: int) -> None:
        self.card_state_cards.set(cards)
        self.card_state_bytes.set(size_bytes)

    def set_terminal_risk(self, terminals: int, size_bytes: int) -> None:
        self.terminals.set(terminals)
        self.terminal_bytes.set(size_bytes)

    def record_terminal_risk_skipped(self, reason: str) -> None:
        self.terminal_skipped.labels(reason).inc()

    def set_card_frauds(self, cards: int, size_bytes: int) -> None:
        self.card_frauds.set(cards)
        self.card_frauds_bytes.set(size_bytes)

    def record_card_frauds_skipped(self, reason: str) -> None:
        self.card_frauds_skipped.labels(reason).inc()

    def watch_topic_reader(self, reader: str, age_s: Callable[[], float]) -> None:
        """A topic reader's read age is `age_s()` at every scrape; its errors start at 0."""
        self.topic_reader_age.labels(reader).set_function(age_s)
        for cause in ("unreadable", "record", "restart", "stopped"):
            self.topic_reader_errors.labels(reader, cause)

    def record_topic_reader_error(self, reader: str, cause: str) -> None:
        self.topic_reader_errors.labels(reader, cause).inc()

    def watch_terminal_risk_age(
        self, age_s: Callable[[], float], state_age_s: Callable[[], float]
    ) -> None:
        """The newest terminal-risk record's age is `age_s()`, and the worker's state's age
        `state_age_s()`, at every scrape."""
        self.terminal_age.set_function(age_s)
        self.terminal_state_age.set_function(state_age_s)
