"""The settings of `fraud-scorer run` for what a decision reads besides its record: the card
history and its changelog, the features worker's tables, the rules, the reasons, drift and the
observed precision.

Declared once each, as in `stream/startup/flow_options.py`, whose class this one extends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from contracts.event_time import DEFAULT_MAX_CLOCK_SKEW_MS
from plumbing.settings import Topic, meta
from scorer.drift import DEFAULT_WINDOW as DEFAULT_DRIFT_WINDOW
from stream.startup.flow_options import FlowOptions

OnOff = Literal["on", "off"]


class DecisionInputOptions(FlowOptions, frozen=True, kw_only=True):
    """What a decision reads besides its record: card history, tables, rules, reasons, drift."""

    card_history: Annotated[
        OnOff,
        meta(
            "FRAUD_CARD_HISTORY",
            "on: keep each card's recent history per partition (event-time windows) for the "
            "model, durable in a compacted changelog topic; off: history features are neutral",
        ),
    ] = "on"
    state_changelog_topic: Annotated[
        str,
        meta(
            "FRAUD_STATE_CHANGELOG_TOPIC",
            "compacted topic of the card histories, as many partitions as the input topic "
            "(default: <group_id>-card-state-changelog)",
        ),
    ] = ""
    history_time_scale: Annotated[
        float,
        meta(
            "FRAUD_HISTORY_TIME_SCALE",
            "event time runs this many times faster than real time (a compressed-time demo): "
            "every history window shrinks by it; 1 in production",
            gt=0,
            le=1e9,
        ),
    ] = 1.0
    state_evict_interval_s: Annotated[
        float,
        meta(
            "FRAUD_STATE_EVICT_INTERVAL_S",
            "how often, in seconds of wall-clock time, each partition forgets the cards idle "
            "past the longest window (as of its event-time watermark), with a tombstone each",
            gt=0,
            le=86_400,
        ),
    ] = 60.0
    state_retain_s: Annotated[
        float,
        meta(
            "FRAUD_STATE_RETAIN_S",
            "how long, in seconds, a replica keeps the cards of a partition it gave up with every "
            "change in the changelog, so that if the partition comes back only the changelog's "
            "records since are read; 0 forgets them at once. Memory: those cards stay counted "
            "in fraud_card_state_cards; keep it below the changelog's delete.retention.ms",
            ge=0,
            le=86_400,
        ),
    ] = 600.0
    state_warm_up: Annotated[
        OnOff,
        meta(
            "FRAUD_STATE_WARM_UP",
            "on: before joining the group, read every partition's changelog and keep the cards "
            "as for a partition given up (FRAUD_STATE_RETAIN_S), so the partitions this replica "
            "is then given read only the changelog written since instead of all of it, and the "
            "replicas they come from are not left waiting for a whole restore. Memory: every "
            "partition's cards until FRAUD_STATE_RETAIN_S passes; start-up: the reading",
        ),
    ] = "off"
    max_clock_skew_ms: Annotated[
        int,
        meta(
            "FRAUD_MAX_CLOCK_SKEW_MS",
            "how far past this host's clock an event time may move the state's clocks (card "
            "windows, eviction, terminal days); a later one never moves them and counts as of "
            "the clock's newest trusted time. History time: divided by FRAUD_HISTORY_TIME_SCALE",
            ge=0,
            le=31_536_000_000,
        ),
    ] = DEFAULT_MAX_CLOCK_SKEW_MS
    terminal_risk_topic: Annotated[
        Topic,
        meta(
            "FRAUD_TERMINAL_RISK_TOPIC",
            "compacted topic of per-terminal risk that fraud-features publishes; every replica "
            "reads all of it (a terminal not there yet gets neutral risk), and <this>-progress, "
            "how far the worker's state reaches (fraud_terminal_risk_state_age_seconds)",
        ),
    ] = "terminal-risk"
    card_frauds_topic: Annotated[
        Topic,
        meta(
            "FRAUD_CARD_FRAUDS_TOPIC",
            "compacted topic of each card's confirmed frauds that fraud-features publishes; "
            "every replica reads all of it (a card not there has none)",
        ),
    ] = "card-frauds"
    rules: Annotated[
        Path | None,
        meta(
            "FRAUD_RULES",
            "rules file, TOML (or YAML: .yaml/.yml, with the yaml extra): deny and allow lists, "
            "threshold overrides per segment and expression rules that overrule the model "
            "(docs/rules.md); a bad file stops the start",
        ),
    ] = None
    rules_topic: Annotated[
        Topic | None,
        meta(
            "FRAUD_RULES_TOPIC",
            "compacted topic of live rule updates on top of the rules file, read whole by "
            "every replica (docs/rules.md); a bad update is dead-lettered and the rules in "
            "force stay",
        ),
    ] = None
    rules_guard_share: Annotated[
        float,
        meta(
            "FRAUD_RULES_GUARD_SHARE",
            "a rules-topic update that would flag (review or decline) more of the last "
            "minute's traffic than this share, and more than the rules in force do, is held: "
            "not applied until it is sent again with the header fraud.rules.confirm=yes "
            "(docs/rules.md); 0: no guard",
            ge=0,
            le=1,
        ),
    ] = 0.5
    reasons: Annotated[
        OnOff,
        meta(
            "FRAUD_REASONS",
            "on: every review and decline the model scores carries its top 3 reasons (one "
            "extra model call over the flagged rows; needs the package's reference row)",
        ),
    ] = "on"
    drift_window: Annotated[
        int,
        meta(
            "FRAUD_DRIFT_WINDOW",
            "scored records per drift measurement: every this many, the population stability "
            "index of the score and of the package's drift features against its [drift] "
            "reference is set (fraud_score_psi, fraud_feature_psi; docs/models.md, Drift)",
            ge=100,
            le=100_000_000,
        ),
    ] = DEFAULT_DRIFT_WINDOW
    observed_precision: Annotated[
        OnOff,
        meta(
            "FRAUD_OBSERVED_PRECISION",
            "on: follow the labels topic (FRAUD_LABELS_TOPIC) and count, for each flagged "
            "transaction once its labels have had their time, whether it turned out fraud "
            "(fraud_flagged_outcomes_total; docs/models.md, Drift)",
        ),
    ] = "off"
    labels_topic: Annotated[
        Topic,
        meta(
            "FRAUD_LABELS_TOPIC",
            "topic of confirmed outcomes (contracts: labels) read for the observed precision, "
            "from its end",
        ),
    ] = "labels"
    observed_precision_maturity_days: Annotated[
        float,
        meta(
            "FRAUD_OBSERVED_PRECISION_MATURITY_DAYS",
            "how long after its event time (history time, like the card windows) a flagged "
            "transaction's label may arrive; one not labelled fraud by then counts as not "
            "fraud: set it past most label delays (fraud_features_label_delay_seconds)",
            gt=0,
            le=365,
        ),
    ] = 7.0
    observed_precision_max_pending: Annotated[
        int,
        meta(
            "FRAUD_OBSERVED_PRECISION_MAX_PENDING",
            "flagged transactions followed at once (about 250 bytes each with its id); more "
            "are not followed (fraud_flagged_outcomes_untracked_total)",
            ge=1,
            le=100_000_000,
        ),
    ] = 200_000
    decision_features: Annotated[
        OnOff,
        meta(
            "FRAUD_DECISION_FEATURES",
            "on: every decision carries the feature row it was scored with (`features`, base64 "
            "float32, 232 characters), what `fraud-train from-topics` trains on: "
            "training sees exactly what serving saw (docs/contracts.md)",
        ),
    ] = "off"
    wait_for_worker: Annotated[
        OnOff,
        meta(
            "FRAUD_WAIT_FOR_WORKER",
            "replays and backfills only: on, a batch is scored only once the features "
            "worker's published state (its progress records) reaches the batch's newest "
            "transaction, so a replay at any speed gets the terminal and card-fraud columns of "
            "its own time; meanwhile it reads on up to its in-flight bound "
            "(fraud_worker_wait_seconds_total). Off in normal serving, where a decision never "
            "waits for the worker "
            '(docs/state.md, "Replays and backfills")',
        ),
    ] = "off"
    terminal_risk_load_timeout_s: Annotated[
        float,
        meta(
            "FRAUD_TERMINAL_RISK_LOAD_TIMEOUT_S",
            "at start, the replica reads its control topics (the rules topic, terminal-risk, "
            "card-frauds) up to their end before it consumes a transaction, and is not ready "
            "meanwhile, however long that takes: it never consumes without them. Past this "
            "long it logs an error naming the topic it waits for and why (docs/state.md)",
            ge=0,
            le=3_600,
        ),
    ] = 120.0
