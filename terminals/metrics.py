"""Every Prometheus metric of the features worker, named `fraud_features_<thing>_<unit>`, and
the small methods the agents call (no other module of the worker touches prometheus_client).

Served on `/metrics` (FRAUD_FEATURES_METRICS_PORT) from prometheus_client's own thread.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

#: Outcomes of a transaction record: counted on its terminal, no terminal (skipped), invalid
#: (skipped: the scorer dead-letters it).
TRANSACTION_OUTCOMES = ("routed", "no_terminal", "invalid")
#: Outcomes of a label record: routed to its terminal (fraud or legit), no terminal (skipped),
#: dead-lettered (decode or validate).
LABEL_OUTCOMES = ("fraud", "legit", "no_terminal", "dead_lettered")


class WorkerMetrics:
    """The worker's counters on a registry of their own (one per process or test)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        self._transactions = Counter(
            "fraud_features_transactions",
            "Transaction records read, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self._labels = Counter(
            "fraud_features_labels",
            "Label records read, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self._events = Counter(
            "fraud_features_terminal_events",
            "Re-keyed terminal events applied to the table: counted, or duplicate (an input "
            "record read again after a restart or rebalance, not counted twice)",
            ["source", "result"],
            registry=self.registry,
        )
        self._published = Counter(
            "fraud_features_risk_published",
            "Terminal risk records published to the terminal-risk topic",
            registry=self.registry,
        )
        self._terminals = Gauge(
            "fraud_features_terminals",
            "Terminals in this replica's table partitions",
            registry=self.registry,
        )
        for outcome in TRANSACTION_OUTCOMES:
            self._transactions.labels(outcome)
        for outcome in LABEL_OUTCOMES:
            self._labels.labels(outcome)

    def transaction(self, outcome: str) -> None:
        self._transactions.labels(outcome).inc()

    def label(self, outcome: str) -> None:
        self._labels.labels(outcome).inc()

    def event(self, source: str, counted: bool) -> None:
        kind = "transaction" if source == "t" else "label"
        self._events.labels(kind, "counted" if counted else "duplicate").inc()

    def published(self) -> None:
        self._published.inc()

    def terminals(self, count: int) -> None:
        self._terminals.set(count)

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics on a daemon thread (OSError if the port is taken)."""
        start_http_server(port, addr=host, registry=self.registry)
