"""The worker's configuration: one typed, frozen object, loaded once at start-up.

Every setting is a flag and an environment variable (a flag wins), declared once on
`FeaturesSettings` with its type, bounds, help and default; `plumbing/settings.py` makes the flags
and converts and checks their text. Names shared with the scorer (bootstrap servers, topics, time
scale, instance id, log settings, the Kafka client settings) read the same variables, so one
environment configures both.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from contracts.event_time import DEFAULT_MAX_CLOCK_SKEW_MS, EventClock
from plumbing.settings import NAME_PATTERN, ServiceSettings, Topic, meta
from scorer.terminal_risk import day_length_ms
from terminals.table_clock import TerminalClock

#: An app id names the consumer group and prefixes the worker's internal topics.
_AppId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=NAME_PATTERN)]


def _default_data_dir() -> str:
    return str(Path(tempfile.gettempdir()) / "fraud-features")


class FeaturesSettings(ServiceSettings, frozen=True, kw_only=True):
    """Every setting of `fraud-features`: name, type and bounds, environment variable, help and
    default (the settings every service shares come first, from `ServiceSettings`)."""

    input_topic: Annotated[
        Topic, meta("FRAUD_INPUT_TOPIC", "topic of the transactions (key card_id)")
    ] = "transactions"
    labels_topic: Annotated[
        Topic, meta("FRAUD_LABELS_TOPIC", "topic of the confirmed outcomes (key card_id)")
    ] = "labels"
    terminal_risk_topic: Annotated[
        Topic,
        meta(
            "FRAUD_TERMINAL_RISK_TOPIC",
            "compacted topic the per-terminal risk is published to (key terminal_id); how far "
            "the published state reaches goes to <this>-progress (compacted, 1 partition)",
        ),
    ] = "terminal-risk"
    card_frauds_topic: Annotated[
        Topic,
        meta(
            "FRAUD_CARD_FRAUDS_TOPIC",
            "compacted topic each card's confirmed frauds are published to (key card_id)",
        ),
    ] = "card-frauds"
    dlq_topic: Annotated[
        Topic, meta("FRAUD_DLQ_TOPIC", "dead-letter topic for labels that break the contract")
    ] = "transactions.dlq"
    app_id: Annotated[
        _AppId,
        meta(
            "FRAUD_FEATURES_APP_ID",
            "faust app id: the consumer group of all replicas and the prefix of the internal "
            "topics (<app-id>-terminal-events, <app-id>-terminal-state-changelog); a new id "
            "starts empty",
        ),
    ] = "fraud-features"
    table_partitions: Annotated[
        int,
        meta(
            "FRAUD_FEATURES_TABLE_PARTITIONS",
            "partitions of the table, its changelog and the re-keyed events topic (the most "
            "replicas that share the work), fixed when faust first creates them; also those of "
            "labels, terminal-risk and card-frauds if `run` creates them",
            ge=1,
            le=10_000,
        ),
    ] = 6
    internal_replication_factor: Annotated[
        int,
        meta(
            "FRAUD_FEATURES_REPLICATION_FACTOR",
            "replicas of each partition of the topics the worker creates (3 on a production "
            "cluster)",
            ge=1,
            le=32,
        ),
    ] = 1
    history_time_scale: Annotated[
        float,
        meta(
            "FRAUD_HISTORY_TIME_SCALE",
            "event time runs this many times faster than real time (a compressed-time demo): a "
            "terminal-risk day lasts 86,400,000 / this ms of event time; 1 in production",
            gt=0,
            le=1e9,
        ),
    ] = 1.0
    max_clock_skew_ms: Annotated[
        int,
        meta(
            "FRAUD_MAX_CLOCK_SKEW_MS",
            "how far past this host's clock an event time or report time may move the worker's "
            "clock and a terminal's day; a later one never moves them and counts on the "
            "worker's newest trusted day (history time: divided by FRAUD_HISTORY_TIME_SCALE). "
            "The scorer's setting of the same name",
            ge=0,
            le=31_536_000_000,
        ),
    ] = DEFAULT_MAX_CLOCK_SKEW_MS
    evict_interval_s: Annotated[
        float,
        meta(
            "FRAUD_FEATURES_EVICT_INTERVAL_S",
            "how often, in seconds of wall-clock time, each table partition forgets the "
            "terminals no window reads any more (a tombstone in the table and in terminal-risk "
            "each)",
            gt=0,
            le=86_400,
        ),
    ] = 60.0
    input_wait_ms: Annotated[
        int,
        meta(
            "FRAUD_FEATURES_INPUT_WAIT_MS",
            "how long since its last read the router waits for an input partition that has "
            "nothing queued (a fetch under way, a leader moving, or read to the end of what the "
            "broker had while a backfill is still being written) before it routes the other "
            "inputs' later records past it, as Kafka Streams' max.task.idle.ms. Records are "
            "routed in event-time order across the transactions and labels, so that the "
            "worker's clock moves only with what every input has reached; in a live run the "
            "wait delays the counts by at most this, and they feed windows that end days back",
            ge=0,
            le=600_000,
        ),
    ] = 5_000
    publish_interval_ms: Annotated[
        int,
        meta(
            "FRAUD_FEATURES_PUBLISH_INTERVAL_MS",
            "how often the worker publishes the terminals and cards whose records changed: "
            "each once a round, as it is then, however many events changed it meanwhile. "
            "Bounds how late a counted label reaches the scorers",
            ge=10,
            le=60_000,
        ),
    ] = 1_000
    ready_max_lag: Annotated[
        int,
        meta(
            "FRAUD_FEATURES_READY_MAX_LAG",
            "the worker is not ready while its router is more than this many input records "
            "behind the inputs' ends, or its table more than this many transactions behind "
            "the internal topic's end (an internal record counted as up to 1,000): a worker "
            "catching up on a backlog says so",
            ge=1,
            le=100_000_000,
        ),
    ] = 20_000
    write_interval_ms: Annotated[
        int,
        meta(
            "FRAUD_FEATURES_WRITE_INTERVAL_MS",
            "how often the worker writes each terminal and card it changed to its table "
            "(changelog): once an interval (or once 1,000 internal records of a partition "
            "are held), however many events changed it meanwhile; the "
            "internal records applied since are committed only once written, so a restart "
            "applies them again (each counted once). 0 writes at every internal record. Each "
            "write is a changelog record per entry changed, most of the worker's CPU at "
            "10,000 (docs/benchmarks.md); 30,000 is Kafka Streams' commit interval",
            ge=0,
            le=600_000,
        ),
    ] = 30_000
    combine: Annotated[
        Literal["on", "off"],
        meta(
            "FRAUD_FEATURES_COMBINE",
            "on: the router sends the transactions of a terminal that has more than one in a "
            "routed batch as one run (their input positions and times), which the table counts "
            "a day at a time instead of an event each: cheaper where terminals see many "
            "transactions a second, each still counted once. Writes internal records of "
            "format 2, which releases before this one skip: leave it off until no rollback to "
            'such a release is planned (docs/state.md, "The combiner")',
        ),
    ] = "off"
    auto_offset_reset: Annotated[
        Literal["earliest", "latest"],
        meta(
            "FRAUD_FEATURES_AUTO_OFFSET_RESET",
            "where a new app id starts reading transactions and labels: earliest (rebuild the "
            "risk from what the topics retain) or latest",
        ),
    ] = "earliest"
    session_timeout_s: Annotated[
        float,
        meta(
            "FRAUD_FEATURES_SESSION_TIMEOUT_S",
            "a replica that dies without leaving the group (kill -9, a lost host) keeps its "
            "partitions this many seconds before the group hands them on; a restarted replica "
            "waits as long. At least the broker's group.min.session.timeout.ms (6 s by default)",
            ge=6,
            le=300,
        ),
    ] = 30.0
    store: Annotated[
        str,
        meta(
            "FRAUD_FEATURES_STORE",
            "faust table store: memory:// (rebuilt from the changelog topic at every start) or "
            "rocksdb:// (needs faust-streaming[rocksdict])",
            pattern=r"^[a-z]+://",
        ),
    ] = "memory://"
    data_dir: Annotated[
        str,
        meta(
            "FRAUD_FEATURES_DATA_DIR",
            "faust's data directory",
            shown_default="<tmp>/fraud-features",
            min_length=1,
        ),
    ] = msgspec.field(default_factory=_default_data_dir)
    metrics_host: Annotated[
        str,
        meta("FRAUD_FEATURES_METRICS_HOST", "address of the /metrics, /healthz and /readyz server"),
    ] = "0.0.0.0"
    metrics_port: Annotated[
        int,
        meta(
            "FRAUD_FEATURES_METRICS_PORT",
            "port of the /metrics, /healthz and /readyz server; 0 disables it",
            ge=0,
            le=65_535,
        ),
    ] = 9103

    @property
    def day_ms(self) -> int:
        """Length of a terminal-risk day in event-time ms (shorter in a compressed-time demo)."""
        return day_length_ms(self.history_time_scale)

    @property
    def clock(self) -> TerminalClock:
        """A new event-time clock (one per table partition): days of `day_ms`, bounded by
        `event_clock`."""
        return TerminalClock(self.day_ms, self.event_clock)

    @property
    def event_clock(self) -> EventClock:
        """The bound on event times: the wall clock plus the allowed skew (history time, like
        the days)."""
        return EventClock(self.max_clock_skew_ms, self.history_time_scale)

    @property
    def service(self) -> str:
        """The `dlq.service` header: consumer group and instance, as the scorer writes it."""
        return f"{self.app_id}/{self.instance_id}"
