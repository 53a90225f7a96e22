"""Every setting of `fraud-review`, declared once (`plumbing/settings.py`): flags, environment
variables, `--help` and the configuration reference come from these declarations."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from plumbing.settings import NAME_PATTERN, ServiceSettings, Topic, meta

_GroupId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=NAME_PATTERN)]


class ReviewSettings(ServiceSettings, frozen=True, kw_only=True):
    """The console's settings; the topics use the scorer's names for the same topics."""

    db: Annotated[
        str,
        meta(
            "FRAUD_REVIEW_DB",
            "where users, cases and the audit log live: a SQLite file (created if missing; keep "
            "it on a persistent volume), or postgresql://USER:PASSWORD@HOST/DB for several "
            "consoles sharing their cases",
            min_length=1,
        ),
    ] = "review.db"
    host: Annotated[str, meta("FRAUD_REVIEW_HOST", "address the console listens on")] = "127.0.0.1"
    port: Annotated[
        int,
        meta(
            "FRAUD_REVIEW_PORT",
            "port of the console: the page, /api, /metrics, /healthz and /readyz",
            ge=1,
            le=65_535,
        ),
    ] = 8088
    output_topic: Annotated[
        Topic, meta("FRAUD_OUTPUT_TOPIC", "the scorer's decisions topic, read for cases")
    ] = "decisions"
    input_topic: Annotated[
        Topic,
        meta(
            "FRAUD_INPUT_TOPIC",
            "the transactions topic, read for the fields a decision lacks (amount, merchant…)",
        ),
    ] = "transactions"
    labels_topic: Annotated[
        Topic, meta("FRAUD_LABELS_TOPIC", "topic every verdict is produced to (key card_id)")
    ] = "labels"
    group_id: Annotated[
        _GroupId,
        meta(
            "FRAUD_REVIEW_GROUP_ID",
            "consumer group of the console; consoles sharing one database share one group",
        ),
    ] = "fraud-review"
    auto_offset_reset: Annotated[
        Literal["earliest", "latest"],
        meta(
            "FRAUD_REVIEW_AUTO_OFFSET_RESET",
            "where a new consumer group starts: earliest reads every decision still on the "
            "topic (nothing missed), latest only those produced from then on (a demo)",
        ),
    ] = "earliest"
    review_declines: Annotated[
        Literal["on", "off"],
        meta(
            "FRAUD_REVIEW_DECLINES",
            "on: a decline opens a case too (a person confirms what the model blocked); off: "
            "only review decisions do",
        ),
    ] = "off"
    case_slo_s: Annotated[
        int,
        meta(
            "FRAUD_REVIEW_CASE_SLO_S",
            "how old the oldest open case may grow, in seconds, before FraudReviewQueueBehind "
            "fires (exported as fraud_review_case_slo_seconds)",
            ge=60,
        ),
    ] = 14_400
    retention_days: Annotated[
        int,
        meta(
            "FRAUD_REVIEW_RETENTION_DAYS",
            "closed cases older than this are deleted (the audit log is kept)",
            ge=1,
            le=3_650,
        ),
    ] = 400
    max_open_cases: Annotated[
        int,
        meta(
            "FRAUD_REVIEW_MAX_OPEN_CASES",
            "open cases at which the console stops reading decisions until some are closed "
            "(nothing is dropped: the consumer lag grows instead)",
            ge=1,
        ),
    ] = 1_000_000
    join_window: Annotated[
        int,
        meta(
            "FRAUD_REVIEW_JOIN_WINDOW",
            "the most recent transactions held for the join with their decisions (about 550 "
            "bytes each: 200,000 take about 110 MB); a decision whose transaction left the "
            "window opens a case without amount and merchant",
            ge=1_000,
        ),
    ] = 200_000
    forwarded_for: Annotated[
        Literal["on", "off"],
        meta(
            "FRAUD_REVIEW_FORWARDED_FOR",
            "on behind a reverse proxy: the failed-login limit counts per client as the proxy's "
            "X-Forwarded-For names it (its last entry), not per proxy",
        ),
    ] = "off"
    secure_cookies: Annotated[
        Literal["on", "off"],
        meta(
            "FRAUD_REVIEW_SECURE_COOKIES",
            "on behind TLS: the session cookie is sent over HTTPS only (it is also when a "
            "proxy says X-Forwarded-Proto: https)",
        ),
    ] = "off"

    @property
    def case_decisions(self) -> frozenset[str]:
        """The decisions that open a case."""
        return frozenset({"review", "decline"} if self.review_declines == "on" else {"review"})
