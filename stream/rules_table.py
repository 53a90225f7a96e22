"""The rules in force on a replica: the FRAUD_RULES file, then the updates of its topic.

Operations change rules live through a compacted topic (FRAUD_RULES_TOPIC, docs/rules.md): a
deny-list entry, a segment override or an expression rule per key, a tombstone to remove one.
Every replica reads the whole topic (`stream/compacted_topic.py`) on a thread of its own and
builds each new rule set beside the one in force; the scoring thread reads `current` once per
batch, so a batch is decided by one rule set. A record that cannot be used is dead-lettered
(reason `rules_update`, `fraud-dlq replay` puts it back once fixed) and the previous rules stay
in force. A replica scores only once the topic is read up to its end at start (`loaded`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, cast

from confluent_kafka import Message, Producer

from contracts.errors import RulesUpdateError
from deadletter.router import DeadLetterRouter
from scorer.rules import Rules, RulesError
from stream.compacted_topic import CompactedTopicReader
from stream.metrics import ServiceMetrics

log = logging.getLogger(__name__)

#: How long a dead letter of a bad update may take to be acknowledged.
DEAD_LETTER_FLUSH_S = 10.0


class RulesTable:
    """`current`: the rules in force; with a topic, kept up to date on a daemon thread."""

    def __init__(
        self,
        base: Rules,
        metrics: ServiceMetrics,
        *,
        kafka: Mapping[str, Any] | None = None,
        topic: str | None = None,
        router: DeadLetterRouter | None = None,
    ) -> None:
        """`base`: the FRAUD_RULES file's rules; `topic` (with `kafka` and the `router` that
        dead-letters bad updates): the rules topic, None for the file alone."""
        #: Replaced whole on each update; the scoring thread reads it once per batch.
        self.current = base
        self._metrics = metrics
        self._kafka = dict(kafka or {})
        self._router = router
        self._producer: Producer | None = None
        self._reader = (
            None
            if topic is None
            else CompactedTopicReader(
                self._kafka,
                topic,
                self._apply,
                name="rules",
                loaded_note=lambda: self.current.summary(),
            )
        )
        #: Set once the topic is read up to its end at start (at once without a topic).
        self.loaded = threading.Event() if self._reader is None else self._reader.loaded
        if self._reader is None:
            self.loaded.set()
        metrics.set_rules_entries(len(base))

    def start(self) -> None:
        log.info("rules in force: %s", self.current.summary())
        if self._reader is not None:
            self._reader.start()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._producer is not None:
            self._producer.flush(DEAD_LETTER_FLUSH_S)

    def _apply(self, message: Message) -> None:
        key = message.key()
        try:
            if key is None:
                raise RulesError("a rules update needs a key, e.g. deny:card:<card id>")
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RulesError(f"the key is not UTF-8: {exc}") from exc
            self.current = self.current.with_update(name, message.value())
        except Exception as exc:  # RulesError, or whatever else a record provokes
            log.warning(
                "rules update refused (dead-lettered; the rules in force stay) "
                "partition=%s offset=%s: %s",
                message.partition(),
                message.offset(),
                exc,
            )
            self._metrics.record_rules_update("rejected")
            self._dead_letter(message, RulesUpdateError(str(exc)))
            return
        self._metrics.record_rules_update("applied")
        self._metrics.set_rules_entries(len(self.current))
        # One line per live update; the catch-up at start may hold many (its summary is logged).
        level = logging.INFO if self.loaded.is_set() else logging.DEBUG
        log.log(level, "rules update %s applied: %s", name, self.current.summary())

    def _dead_letter(self, message: Message, error: RulesUpdateError) -> None:
        """Send the update's dead letter; a failure is logged, never stops the reader."""
        if self._router is None:
            return
        try:
            letter = self._router.dead_letter(message, error)
            if self._producer is None:
                self._producer = Producer(self._kafka)
            self._producer.produce(
                letter.topic, key=letter.key, value=letter.value, headers=cast(Any, letter.headers)
            )
            if self._producer.flush(DEAD_LETTER_FLUSH_S):
                raise TimeoutError("not acknowledged in time")
        except Exception:
            log.exception(
                "the dead letter of a rules update (partition=%s offset=%s) was not sent",
                message.partition(),
                message.offset(),
            )
