"""The console's metrics (`/metrics`): the queue's state, as the ingest counted it last (once a
second: a count scans the open cases' index), and counters of what was opened, decided and
skipped."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge


class ReviewMetrics:
    """Every metric of `fraud-review`, in its own registry."""

    def __init__(self, case_slo_s: int) -> None:
        self.registry = CollectorRegistry()
        self.open_cases = Gauge(
            "fraud_review_open_cases", "Cases waiting for a verdict", registry=self.registry
        )
        self.oldest_open_case_age = Gauge(
            "fraud_review_oldest_open_case_age_seconds",
            "Age of the oldest open case (since it was opened); 0 when none is open",
            registry=self.registry,
        )
        self.case_slo = Gauge(
            "fraud_review_case_slo_seconds",
            "How old the oldest open case may grow (FRAUD_REVIEW_CASE_SLO_S)",
            registry=self.registry,
        )
        self.case_slo.set(case_slo_s)
        self.cases_opened = Counter(
            "fraud_review_cases_opened_total",
            "Cases opened from flagged decisions",
            registry=self.registry,
        )
        self.verdicts = Counter(
            "fraud_review_verdicts_total",
            "Verdicts recorded, each produced as a label (action: verdict on an open case, "
            "reversal of a closed one)",
            ["verdict", "action"],
            registry=self.registry,
        )
        self.records_skipped = Counter(
            "fraud_review_records_skipped_total",
            "Records of the decisions or transactions topic skipped (reason: invalid, too_large)",
            ["topic", "reason"],
            registry=self.registry,
        )
        self.failed_logins = Counter(
            "fraud_review_failed_logins_total",
            "Logins and API requests refused for a wrong name or password, or rate-limited",
            ["outcome"],
            registry=self.registry,
        )
        self._oldest_opened_ms: int | None = None
        self.oldest_open_case_age.set_function(self._oldest_age_s)
        self.ingest_paused = Gauge(
            "fraud_review_ingest_paused",
            "1 while reading decisions is paused at FRAUD_REVIEW_MAX_OPEN_CASES open cases",
            registry=self.registry,
        )

    def queue_state(self, open_cases: int, oldest_opened_ms: int | None) -> None:
        """The ingest's latest count of open cases and when the oldest was opened."""
        self.open_cases.set(open_cases)
        self._oldest_opened_ms = oldest_opened_ms

    def _oldest_age_s(self) -> float:
        oldest = self._oldest_opened_ms
        return 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)
