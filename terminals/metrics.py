"""Every Prometheus metric of the features worker, named `fraud_features_<thing>_<unit>`, and
the small methods the agents call (no other module of the worker touches prometheus_client).

Served on `/metrics` (FRAUD_FEATURES_METRICS_PORT) with `/healthz` and `/readyz`
(`plumbing/health.py`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Outcomes of a transaction record: counted on its terminal, no terminal (skipped), invalid
#: (skipped: the scorer dead-letters it).
TRANSACTION_OUTCOMES = ("routed", "no_terminal", "invalid")
#: Outcomes of a label record: routed to its terminal and its card (fraud or legit), to its card
#: only (no terminal), dead-lettered (decode or validate).
LABEL_OUTCOMES = ("fraud", "legit", "no_terminal", "dead_lettered")
#: A minute to two months: analyst reviews take hours, chargebacks days to weeks.
LABEL_DELAY_BUCKETS: tuple[float, ...] = (60.0, 600.0, 3_600.0, 4 * 3_600.0, 12 * 3_600.0, 86_400.0)
LABEL_DELAY_BUCKETS += (2.5 * 86_400.0, 7 * 86_400.0, 14 * 86_400.0, 30 * 86_400.0, 60 * 86_400.0)
#: The worker's stages, as `fraud_features_stage_cpu_seconds_total` names them: the router's
#: decoding and queueing (read) and its ordering, batching, producing and committing (route);
#: the table agent applying events (apply), writing the entries they changed to the tables
#: (write), and publishing records (publish).
STAGES = ("read", "route", "apply", "write", "publish")


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
            "Re-keyed terminal events applied to the table, by result: counted; duplicate (an "
            "input record read again after a restart or rebalance, not counted twice); repeated "
            "(a label with the outcome already in force for its transaction); corrected (a "
            "label that changed its transaction's outcome); stale (older than every window); "
            "unreadable (the entry's table value cannot be read, one of a newer release's "
            "format: not applied)",
            ["source", "result"],
            registry=self.registry,
        )
        self._future = Counter(
            "fraud_features_event_time_future",
            "Event times past the wall clock plus the allowed skew, counted on the worker's newest "
            "trusted day; once per table an event is applied to (a label naming a terminal "
            "counts for the terminal and for the card)",
            registry=self.registry,
        )
        self._published = Counter(
            "fraud_features_risk_published",
            "Terminal risk records published to the terminal-risk topic: features, or a "
            "tombstone (the terminal's risk became neutral, or it went idle)",
            ["kind"],
            registry=self.registry,
        )
        self._evicted = Counter(
            "fraud_features_terminals_evicted",
            "Idle terminals forgotten (no window reads any of their days again)",
            registry=self.registry,
        )
        self._retries = Counter(
            "fraud_features_delivery_retries",
            "Rounds of routed records and dead letters sent again after the broker did not "
            "acknowledge them",
            registry=self.registry,
        )
        self._stalled = Gauge(
            "fraud_features_stalled",
            "1 while re-keyed events wait in a partition this replica owns and its table agent "
            "has applied none of them for 30 s (its /healthz then fails)",
            registry=self.registry,
        )
        self._input_lag = Gauge(
            "fraud_features_input_lag_records",
            "Records of the transactions and labels partitions this replica's router owns that "
            "it has not routed yet (read ahead and queued, or not read): how far it is behind "
            "the inputs' ends",
            registry=self.registry,
        )
        self._internal_lag = Gauge(
            "fraud_features_internal_lag_records",
            "Records of the internal topic's partitions this replica's table owns that it has "
            "not applied yet (each carries up to 1,000 routed transactions)",
            registry=self.registry,
        )
        self._routed_event_time = Gauge(
            "fraud_features_routed_event_time_seconds",
            "The newest event time (epoch s) of a transaction this replica's router routed",
            registry=self.registry,
        )
        self._counted_event_time = Gauge(
            "fraud_features_counted_event_time_seconds",
            "The newest event time (epoch s) of a transaction this replica's table counted",
            registry=self.registry,
        )
        self._terminals = Gauge(
            "fraud_features_terminals",
            "Terminals in this replica's table partitions",
            registry=self.registry,
        )
        self._card_events = Counter(
            "fraud_features_card_events",
            "Labels applied to the per-card table of confirmed frauds, by result (as "
            "fraud_features_terminal_events)",
            ["result"],
            registry=self.registry,
        )
        self._card_published = Counter(
            "fraud_features_card_frauds_published",
            "Card records published to the card-frauds topic: frauds, or a tombstone (no window "
            "reads any of the card's frauds any more)",
            ["kind"],
            registry=self.registry,
        )
        self._cards_evicted = Counter(
            "fraud_features_cards_evicted",
            "Idle cards forgotten (no window reads any of their frauds again)",
            registry=self.registry,
        )
        self._cards = Gauge(
            "fraud_features_cards",
            "Cards with a confirmed fraud in this replica's table partitions",
            registry=self.registry,
        )
        self._label_delay = Histogram(
            "fraud_features_label_delay_seconds",
            "How long after its transaction a label was reported "
            "(reported_at - event_time; in event time, so a compressed-time run shows it "
            "compressed)",
            buckets=LABEL_DELAY_BUCKETS,
            registry=self.registry,
        )
        self._history_time_scale = Gauge(
            "fraud_features_history_time_scale",
            "FRAUD_HISTORY_TIME_SCALE: how many times faster than real time event time runs "
            "(a terminal-risk day lasts 86,400,000 / this ms); the scorer's "
            "fraud_history_time_scale must be the same",
            registry=self.registry,
        )
        self._stage_cpu = Counter(
            "fraud_features_stage_cpu_seconds",
            "CPU time of the thread running each stage of the worker (read, route, apply, "
            "write, publish; see docs/state.md): what faust and the Kafka clients spend besides is "
            "about the process's CPU minus their sum (apply and publish run on faust's event "
            "loop, and one waiting on a send also counts what the loop runs meanwhile)",
            ["stage"],
            registry=self.registry,
        )
        for stage in STAGES:
            self._stage_cpu.labels(stage)
        for outcome in TRANSACTION_OUTCOMES:
            self._transactions.labels(outcome)
        for outcome in LABEL_OUTCOMES:
            self._labels.labels(outcome)
        for kind in ("features", "tombstone"):
            self._published.labels(kind)
        for kind in ("frauds", "tombstone"):
            self._card_published.labels(kind)

    def transaction(self, outcome: str, count: int = 1) -> None:
        self._transactions.labels(outcome).inc(count)

    def label(self, outcome: str) -> None:
        self._labels.labels(outcome).inc()

    def label_delay(self, delay_ms: int) -> None:
        self._label_delay.observe(max(delay_ms, 0) / 1000.0)

    def event(self, source: str, result: str, *, card: bool = False, count: int = 1) -> None:
        if card:
            self._card_events.labels(result).inc(count)
            return
        kind = "transaction" if source == "t" else "label"
        self._events.labels(kind, result).inc(count)

    def stage_cpu(self, stage: str, seconds: float) -> None:
        self._stage_cpu.labels(stage).inc(seconds)

    def future_event(self, count: int = 1) -> None:
        self._future.inc(count)

    def published(self, *, tombstone: bool = False, card: bool = False) -> None:
        if card:
            self._card_published.labels("tombstone" if tombstone else "frauds").inc()
        else:
            self._published.labels("tombstone" if tombstone else "features").inc()

    def evicted(self, count: int, *, card: bool = False) -> None:
        (self._cards_evicted if card else self._evicted).inc(count)

    def delivery_retry(self) -> None:
        self._retries.inc()

    def input_lag(self, records: int) -> None:
        self._input_lag.set(records)

    def internal_lag(self, records: int) -> None:
        self._internal_lag.set(records)

    def routed_event_time(self, time_ms: int) -> None:
        self._routed_event_time.set(time_ms / 1000)

    def counted_event_time(self, time_ms: int) -> None:
        self._counted_event_time.set(time_ms / 1000)

    def stalled(self, stalled: bool) -> None:
        self._stalled.set(1 if stalled else 0)

    def terminals(self, count: int) -> None:
        self._terminals.set(count)

    def cards(self, count: int) -> None:
        self._cards.set(count)

    def history_time_scale(self, scale: float) -> None:
        self._history_time_scale.set(scale)
