"""Every Prometheus metric of the scorer, named `fraud_<thing>_<unit>`, with its buckets: the
one place where the service's Prometheus objects are defined (STYLE.md, item 8).

`MetricDefinitions` registers them on the registry it is given (as faust's Prometheus sensor
takes `registry=`): the service uses prometheus_client's default one, which `/metrics` serves;
a test gives each replica its own and reads it with `registry.get_sample_value()`. The code
never updates them here: `ServiceMetrics` (stream/metrics.py) adds the small methods it calls.
The definitions stand apart from those methods so that every name, help text and bucket the
dashboards, alerts and docs/metrics.md rely on reads in one place. Their attributes are public
because another module updates them: `ServiceMetrics`, and only it; the rest of the code calls
its methods (STYLE.md, item 8).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from stream.batch_histogram import BatchHistogram

#: Powers of two up to the largest useful batch, so "never over the cap" reads off one bucket.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
#: Sub-millisecond to a second: batch waits and inference both live in this range.
SHORT_SECONDS_BUCKETS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005)
SHORT_SECONDS_BUCKETS += (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Stages of a batch (`fraud_stage_seconds{stage}`), in the order a record passes them.
STAGES = ("queue", "batch", "handoff", "state", "terminal", "decide", "encode", "delivery")
#: Fine between 10 ms and 0.5 s, where a latency tail is told apart.
STAGE_SECONDS_BUCKETS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005)
STAGE_SECONDS_BUCKETS += (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 10.0)
#: End-to-end: the SLO region (tens of ms) finely, then a tail up to a minute for backlogs.
LATENCY_SECONDS_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05)
LATENCY_SECONDS_BUCKETS += (0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
#: Fraud scores: calibrated scores sit mostly below 0.01 (the fraud rate), so fine there.
SCORE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


class MetricDefinitions:
    """The scorer's metrics on one registry, one attribute each; `ServiceMetrics` records in
    them."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        r = registry
        self.consumed = Counter(
            "fraud_records_consumed_total", "Records read from the input topic", registry=r
        )
        self.decisions = Counter(
            "fraud_decisions_produced_total",
            "Decisions acknowledged by the broker",
            ["decision"],
            registry=r,
        )
        self.dead_letters = Counter(
            "fraud_dead_letters_total",
            "Dead letters acknowledged by the broker",
            ["reason"],
            registry=r,
        )
        self.batch_size = Histogram(
            "fraud_batch_size_records",
            "Records per scored micro-batch",
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_wait = Histogram(
            "fraud_batch_wait_seconds",
            "Time from a batch's first record to its flush",
            buckets=SHORT_SECONDS_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            "fraud_inference_seconds",
            "Time of one model call (features excluded)",
            buckets=SHORT_SECONDS_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "fraud_stage_seconds",
            "Where a batch's time goes, one observation per batch and stage (stream/scoring.py, "
            "Stages): queue (producer to batch), batch (to its close), handoff, state, terminal, "
            "decide, encode, delivery (first output produced to last acknowledged)",
            ["stage"],
            buckets=STAGE_SECONDS_BUCKETS,
            registry=r,
        )
        for stage in STAGES:
            self.stage.labels(stage)
        self.event_to_decision = BatchHistogram(
            "fraud_event_to_decision_seconds",
            "Transaction event_time to decided_at",
            LATENCY_SECONDS_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "fraud_in_flight_records",
            "Records consumed whose outcome is not yet durable",
            registry=r,
        )
        self.in_flight_bytes = Gauge(
            "fraud_in_flight_bytes",
            "Key and value bytes of the records counted in fraud_in_flight_records",
            registry=r,
        )
        self.paused = Gauge(
            "fraud_paused_partitions", "Assigned partitions paused by backpressure", registry=r
        )
        self.held = Gauge(
            "fraud_held_partitions",
            "Partitions waiting at a record whose schema lookup failed for a cause that may "
            "pass (the Schema Registry down or refusing): read again after a backoff",
            registry=r,
        )
        self.consumer_lag = Gauge(
            "fraud_consumer_lag_records",
            "Log end offset minus committed offset, per partition (what KEDA's Kafka scaler uses)",
            ["topic", "partition"],
            registry=r,
        )
        self.time_lag = Gauge(
            "fraud_time_lag_seconds",
            "Age of the oldest event_time in the batch being scored now",
            registry=r,
        )
        self.batch_cap = Gauge(
            "fraud_batch_size_cap_records", "Current cap on records per micro-batch", registry=r
        )
        self.batch_cap_changes = Counter(
            "fraud_batch_size_cap_changes_total",
            "Changes of the adaptive batch cap",
            ["direction"],
            registry=r,
        )
        self.reasons = Histogram(
            "fraud_reasons_seconds",
            "Time to compute the reasons of a batch's flagged decisions (one model call)",
            buckets=SHORT_SECONDS_BUCKETS,
            registry=r,
        )
        self.rule_hits = Counter(
            "fraud_rule_hits_total",
            "Decisions a rule hit (FRAUD_RULES), by rule",
            ["rule"],
            registry=r,
        )
        self.rules_updates = Counter(
            "fraud_rules_updates_total",
            "Records of the rules topic, by result (applied, rejected: dead-lettered, "
            "refused_at_start: refused while the topic was read at start, not dead-lettered "
            "again, held: it would flag more of the traffic than FRAUD_RULES_GUARD_SHARE, "
            "not applied until confirmed, or taken out of force if read at start; waiting: a "
            "rule or override read before the guard's sample could judge it, applied or held "
            "once it can; dropped: one that waited, dropped past the most that may wait)",
            ["result"],
            registry=r,
        )
        self.rules_entries = Gauge(
            "fraud_rules_entries",
            "Rules in force: list entries, segment overrides and expression rules",
            registry=r,
        )
        self.late = Counter(
            "fraud_late_records_total",
            "Transactions whose decision deadline had passed at batch time",
            registry=r,
        )
        self.degraded = Counter(
            "fraud_degraded_decisions_total",
            "Decisions made by the fallback rules instead of the model",
            ["cause"],
            registry=r,
        )
        self.retries = Counter(
            "fraud_delivery_retries_total",
            "Retries of outputs the broker did not acknowledge",
            ["cause"],
            registry=r,
        )
        self.dead_letter_failures = Counter(
            "fraud_dead_letter_produce_failures_total",
            "Dead letters the broker did not acknowledge (each is retried)",
            ["cause"],
            registry=r,
        )
        self.stalled = Gauge(
            "fraud_delivery_stalled",
            "1 while retries are exhausted and fetching is stopped",
            registry=r,
        )
        self.producer_replacements = Counter(
            "fraud_producer_replacements_total",
            "Transactional producers replaced after every broker went away or an abort was refused "
            "as INVALID_TXN_STATE (exactly-once)",
            registry=r,
        )
        self.poison = Counter(
            "fraud_poison_records_total",
            "Records isolated by bisection as breaking the model",
            registry=r,
        )
        self.restore = Histogram(
            "fraud_state_restore_seconds",
            "Time to restore one partition's card state from its changelog, by what was read: "
            "whole (the changelog from its start) or tail (a partition that came back with its "
            "cards kept: only what was written since it went)",
            ["read"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
            registry=r,
        )
        self.restore_records = Counter(
            "fraud_state_restore_changelog_records",
            "Changelog records read by card state restores, by what was read (whole or tail)",
            ["read"],
            registry=r,
        )
        for read in ("whole", "tail"):
            self.restore.labels(read)
            self.restore_records.labels(read)
        self.kept = Gauge(
            "fraud_state_kept_partitions",
            "Partitions revoked with every change durable whose cards this replica keeps, not "
            "owned, for FRAUD_STATE_RETAIN_S: a return reads only the changelog's tail",
            registry=r,
        )
        self.restoring = Gauge(
            "fraud_state_restoring_partitions",
            "Assigned partitions paused while their card state restores in the background (the "
            "partitions already owned are scored meanwhile)",
            registry=r,
        )
        self.out_of_bounds = Counter(
            "fraud_state_event_time_out_of_bounds_total",
            "Records whose event time the card state did not take as it is: future (past the "
            "wall clock plus the allowed skew: counted as of the partition's watermark) or "
            "stale (older than the longest window as of the watermark: the state is unchanged)",
            ["reason"],
            registry=r,
        )
        self.rollbacks = Counter(
            "fraud_state_rollbacks_total",
            "Card state rollbacks after an aborted transaction (exactly-once), by method: undo "
            "(the aborted batches' changes put back) or reload (read from the changelog)",
            ["method"],
            registry=r,
        )
        for reason in ("future", "stale"):
            self.out_of_bounds.labels(reason)
        for method in ("undo", "reload"):
            self.rollbacks.labels(method)
        self.card_state_cards = Gauge(
            "fraud_card_state_cards", "Cards whose history this replica holds", registry=r
        )
        self.card_state_bytes = Gauge(
            "fraud_card_state_bytes", "Memory held by the card histories", registry=r
        )
        self.terminals = Gauge(
            "fraud_terminal_risk_terminals",
            "Terminals in this replica's copy of terminal-risk",
            registry=r,
        )
        self.terminal_bytes = Gauge(
            "fraud_terminal_risk_bytes",
            "Memory held by this replica's copy of terminal-risk",
            registry=r,
        )
        self.terminal_age = Gauge(
            "fraud_terminal_risk_newest_record_age_seconds",
            "Age of the newest terminal-risk record this replica holds (its Kafka timestamp): "
            "it grows while the features worker publishes nothing",
            registry=r,
        )
        self.terminal_state_age = Gauge(
            "fraud_terminal_risk_state_age_seconds",
            "How far (event time) the newest transaction scored is past what the features "
            "worker has counted and published (its progress records); NaN until known",
            registry=r,
        )
        self.worker_wait = Counter(
            "fraud_worker_wait_seconds",
            "Seconds scoring waited, with FRAUD_WAIT_FOR_WORKER=on (replays and backfills), for "
            "the features worker's published state to reach the next batch's newest transaction",
            registry=r,
        )
        self.terminal_skipped = Counter(
            "fraud_terminal_risk_records_skipped_total",
            "terminal-risk records not taken: invalid, or future (as of a day past this host's "
            "clock plus the allowed skew); progress: a progress record not readable or past the "
            "clock",
            ["reason"],
            registry=r,
        )
        self.card_frauds = Gauge(
            "fraud_card_frauds_cards",
            "Cards in this replica's copy of card-frauds (those with a confirmed fraud)",
            registry=r,
        )
        self.card_frauds_bytes = Gauge(
            "fraud_card_frauds_bytes",
            "Memory held by this replica's copy of card-frauds",
            registry=r,
        )
        self.card_frauds_skipped = Counter(
            "fraud_card_frauds_records_skipped_total",
            "card-frauds records not taken: invalid, or future (as of a day past this host's "
            "clock plus the allowed skew)",
            ["reason"],
            registry=r,
        )
        for reason in ("invalid", "future"):
            self.terminal_skipped.labels(reason)
            self.card_frauds_skipped.labels(reason)
        self.terminal_skipped.labels("progress")
        self.topic_reader_age = Gauge(
            "fraud_topic_reader_read_age_seconds",
            "Seconds since a topic reader (reader: rules, terminal-risk, terminal-risk-progress, "
            "card-frauds, the control topics; labels) last read its topic without error: it "
            "grows while the "
            "topic cannot be read (not authorized, refused, the broker away)",
            ["reader"],
            registry=r,
        )
        self.topic_reader_errors = Counter(
            "fraud_topic_reader_errors_total",
            "What went wrong in a topic reader, by cause: unreadable (a pass over the topic "
            "failed: no metadata, not authorized, a read error), record (a record its table "
            "could not take: skipped), restart (its consumer failed and was started again), "
            "stopped (its thread ended: nothing more is read; a control topic's makes the "
            "replica not alive)",
            ["reader", "cause"],
            registry=r,
        )
        self.model = Gauge(
            "fraud_model_info", "The model in use (value 1)", ["model_version"], registry=r
        )
        self.expected_flag_rate = Gauge(
            "fraud_model_expected_flag_ratio",
            "The share of decisions at review or decline the model in use expects at its "
            "thresholds, as a range (bound: low, high; the package's [thresholds] "
            "expected_flag_rate); NaN when the package states none or FRAUD_REVIEW_THRESHOLD / "
            "FRAUD_DECLINE_THRESHOLD override its thresholds",
            ["bound"],
            registry=r,
        )
        self.history_time_scale = Gauge(
            "fraud_history_time_scale",
            "FRAUD_HISTORY_TIME_SCALE: how many times faster than real time event time runs for "
            "the history windows (1 in production); fraud-loadgen reads it to send simulated "
            "time at the same pace",
            registry=r,
        )
        self.provider = Gauge(
            "fraud_execution_provider_info",
            "The ONNX Runtime execution provider in use (value 1)",
            ["provider"],
            registry=r,
        )
        self.scores = BatchHistogram(
            "fraud_model_score",
            "Scores of the served model (every record it scored)",
            SCORE_BUCKETS,
            registry=r,
        )
        self.shadow_scores = BatchHistogram(
            "fraud_shadow_model_score",
            "Scores of the challenger in shadow (FRAUD_SHADOW_MODEL), of the same records",
            SCORE_BUCKETS,
            registry=r,
        )
        self.shadow_decisions = Counter(
            "fraud_shadow_decisions_total",
            "Records scored by both models, by the served model's label and the challenger's "
            "(each by its own thresholds, rules not applied): agreement is served == shadow",
            ["served", "shadow"],
            registry=r,
        )
        self.shadow_failures = Counter(
            "fraud_shadow_failures_total",
            "Batches the challenger in shadow failed on (decided and sent without shadow records)",
            registry=r,
        )
        self.shadow_dropped = Counter(
            "fraud_shadow_records_dropped_total",
            "Shadow records not written, decisions unaffected: busy (the challenger still had "
            "its most batches waiting), late (not scored within FRAUD_SHADOW_TIMEOUT_MS of the "
            "decisions), refused (the broker refused or did not acknowledge it)",
            ["reason"],
            registry=r,
        )
        for reason in ("busy", "late", "refused"):
            self.shadow_dropped.labels(reason)
        self.score_psi = Gauge(
            "fraud_score_psi",
            "Population stability index of the served model's scores over the last "
            "FRAUD_DRIFT_WINDOW scored records, against its package's [drift] reference "
            "(above 0.25: a shift worth a look)",
            registry=r,
        )
        self.flagged_outcomes = Counter(
            "fraud_flagged_outcomes_total",
            "Flagged (review or decline) transactions whose labels had their time to arrive "
            "(FRAUD_OBSERVED_PRECISION_MATURITY_DAYS), by outcome: fraud (a fraud label came), "
            "legit (a legitimate one did) or unreported (none); observed precision is fraud over "
            "all three",
            ["outcome"],
            registry=r,
        )
        for outcome in ("fraud", "legit", "unreported"):
            self.flagged_outcomes.labels(outcome)
        self.flagged_pending = Gauge(
            "fraud_flagged_outcomes_pending",
            "Flagged transactions followed until their labels have had their time to arrive",
            registry=r,
        )
        self.flagged_untracked = Counter(
            "fraud_flagged_outcomes_untracked_total",
            "Flagged transactions not followed for observed precision: "
            "FRAUD_OBSERVED_PRECISION_MAX_PENDING were followed already",
            registry=r,
        )
        self.feature_psi = Gauge(
            "fraud_feature_psi",
            "Population stability index of a drift feature of the served model's package over "
            "the last FRAUD_DRIFT_WINDOW scored records, against its [drift] reference",
            ["feature"],
            registry=r,
        )
        self.model_reloads = Counter(
            "fraud_model_reloads_total",
            "New model packages found at FRAUD_MODEL_PATH (role served) or FRAUD_SHADOW_MODEL "
            "(role shadow): loaded (it scores from the next batch), refused (a check failed; "
            "the model before stays) or unavailable (the source, an MLflow server, could not be "
            "read; asked again at the next poll)",
            ["role", "result"],
            registry=r,
        )
        for result in ("loaded", "refused", "unavailable"):
            self.model_reloads.labels("served", result)
        self.model_rollbacks = Counter(
            "fraud_model_rollbacks_total",
            "Models the scoring stage went back from: a newly loaded model failed most records "
            "of a batch (dead letters, or the fallback rules) that the model before it decided; "
            "that batch was decided by the model before, which serves on",
            registry=r,
        )
