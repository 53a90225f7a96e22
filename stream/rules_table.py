"""The rules in force on a replica: the FRAUD_RULES file, then the updates of its topic.

Operations change rules live through a compacted topic (FRAUD_RULES_TOPIC, docs/rules.md): a
deny-list entry, a segment override or an expression rule per key, a tombstone to remove one.
Every replica reads the whole topic (`stream/compacted_topic.py`) on a thread of its own and
builds each new rule set beside the one in force; the scoring thread reads `current` once per
batch, so a batch is decided by one rule set. A record that cannot be used is dead-lettered
(reason `rules_update`, `fraud-dlq replay` puts it back once fixed) and the previous rules stay
in force. A replica scores only once the topic is read up to its end at start (`loaded`).

With a guard (FRAUD_RULES_GUARD_SHARE, `stream/rules_guard.py`) an update read live that would
flag more than its share of the last minute's traffic is held, not applied, until it is sent
again with the header `fraud.rules.confirm: yes` (`fraud_rules_updates_total{result="held"}`).
The catch-up at start applies the topic as it is: a held update left the latest of its key is
applied by a replica that starts later (resolve a hold at once: confirm it, or replace it).

Dead letters never hold the reader: each is produced and its delivery report polled for after
every read, a failure logged from it. The records the topic held at start (the catch-up) are
not dead-lettered again: each was when a replica first read it live. Those refused are counted
(`fraud_rules_updates_total{result="refused_at_start"}`) and named in one summary line.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from confluent_kafka import KafkaError, Message, Producer

from contracts.errors import RulesUpdateError
from deadletter.router import DeadLetterRouter
from scorer.columns import TransactionFields
from scorer.decisions import Thresholds
from scorer.rules import MAX_KEY_CHARS, Rules, RulesError
from stream.compacted_topic import CompactedTopicReader
from stream.metrics import ServiceMetrics
from stream.rules_guard import RulesGuard

log = logging.getLogger(__name__)

#: How long `close()` waits for the dead letters still in flight.
CLOSE_FLUSH_S = 10.0
#: The refused updates of the catch-up at start that its summary line names (the rest counted).
SUMMARY_NAMED = 5
#: A key longer than this is refused before it is decoded (UTF-8 takes up to 4 bytes a
#: character).
MAX_KEY_BYTES = 4 * MAX_KEY_CHARS
#: The header (and its value) that confirms an update the guard held.
CONFIRM_HEADER, CONFIRMED = "fraud.rules.confirm", b"yes"


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
        guard: RulesGuard | None = None,
    ) -> None:
        """`base`: the FRAUD_RULES file's rules; `topic` (with `kafka` and the `router` that
        dead-letters bad updates): the rules topic, None for the file alone; `guard`: what
        holds an update that would flag too much of the traffic (None: no guard)."""
        #: Replaced whole on each update; the scoring thread reads it once per batch.
        self.current = base
        self._metrics = metrics
        self._kafka = dict(kafka or {})
        self._router = router
        self._guard = guard
        self._producer: Producer | None = None
        #: The catch-up's refused updates: how many, and the first SUMMARY_NAMED of them.
        self._refused_at_start = 0
        self._refused_named: list[str] = []
        self._reader = (
            None
            if topic is None
            else CompactedTopicReader(
                self._kafka,
                topic,
                self._apply,
                name="rules",
                metrics=metrics,
                after_read=self._poll_dead_letters,
                loaded_note=self._loaded_note,
            )
        )
        #: Set once the topic is read up to its end at start (at once without a topic).
        self.loaded = threading.Event() if self._reader is None else self._reader.loaded
        if self._reader is None:
            self.loaded.set()
        metrics.set_rules_entries(len(base))

    @property
    def problem(self) -> str | None:
        """Why the topic cannot be read now; None while it can (or without a topic)."""
        return None if self._reader is None else self._reader.problem

    def stopped(self) -> str | None:
        """Why the topic's reader ended before `close()`; None while it runs (or without a
        topic)."""
        return None if self._reader is None else self._reader.stopped()

    def observe(
        self,
        transactions: Sequence[TransactionFields],
        features: npt.NDArray[np.float32],
        scores: npt.NDArray[np.float32],
        thresholds: Thresholds,
    ) -> None:
        """A decided batch, for the guard's sample of the traffic (on the scoring thread)."""
        if self._guard is not None:
            self._guard.observe(transactions, features, scores, thresholds)

    def start(self) -> None:
        log.info("rules in force: %s", self.current.summary())
        if self._reader is not None:
            self._reader.start()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._producer is not None:
            left = self._producer.flush(CLOSE_FLUSH_S)
            if left:
                log.error("%s dead letters of rules updates were never acknowledged", left)

    def _apply(self, message: Message) -> None:
        key = message.key()
        try:
            if key is None:
                raise RulesError("a rules update needs a key, e.g. deny:card:<card id>")
            if len(key) > MAX_KEY_BYTES:
                raise RulesError(f"the key holds {len(key):,} bytes, over {MAX_KEY_BYTES}")
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RulesError(f"the key is not UTF-8: {exc}") from exc
            updated = self.current.with_update(name, message.value())
            if self._held(message, name, updated):
                return
            self.current = updated
        except Exception as exc:  # RulesError, or whatever else a record provokes
            self._refused(message, exc)
            return
        self._metrics.record_rules_update("applied")
        self._metrics.set_rules_entries(len(self.current))
        # One line per live update; the catch-up at start may hold many (its summary is logged).
        level = logging.INFO if self.loaded.is_set() else logging.DEBUG
        log.log(level, "rules update %s applied: %s", name, self.current.summary())

    def _held(self, message: Message, name: str, updated: Rules) -> bool:
        """Whether the guard holds this update (read live and not confirmed); counted and
        logged."""
        guard, reader = self._guard, self._reader
        if guard is None or reader is None or reader.in_catch_up(message):
            return False
        headers = cast(list[tuple[str, bytes | None]], message.headers() or [])
        confirmed = (CONFIRM_HEADER, CONFIRMED) in headers
        if confirmed:
            log.warning(
                "rules update %s confirmed (%s): not judged by the guard", name, CONFIRM_HEADER
            )
            return False
        held = guard.check(name, message.value() is not None, self.current, updated)
        if held is None:
            return False
        self._metrics.record_rules_update("held")
        log.error(
            "rules update %s held (partition=%s offset=%s): it would flag %.1f%% of the last "
            "minute's %s transactions sampled (%.1f%% now), over FRAUD_RULES_GUARD_SHARE=%s; "
            "send it again with the header %s: %s to apply it",
            name,
            message.partition(),
            message.offset(),
            100 * held.share_new,
            held.rows,
            100 * held.share_now,
            guard.share,
            CONFIRM_HEADER,
            CONFIRMED.decode(),
        )
        return True

    def _refused(self, message: Message, error: Exception) -> None:
        """Dead-letter an update read live; count one of the catch-up at start."""
        where = f"partition={message.partition()} offset={message.offset()}"
        if self._reader is not None and self._reader.in_catch_up(message):
            self._refused_at_start += 1
            if len(self._refused_named) < SUMMARY_NAMED:
                self._refused_named.append(f"{message.key()!r} at {where}: {error}")
            self._metrics.record_rules_update("refused_at_start")
            log.debug("rules update refused at start %s: %s", where, error)
            return
        log.warning(
            "rules update refused (dead-lettered; the rules in force stay) %s: %s", where, error
        )
        self._metrics.record_rules_update("rejected")
        self._dead_letter(message, RulesUpdateError(str(error)), where)

    def _loaded_note(self) -> str:
        """What the catch-up at start left in force, for the reader's "loaded" line; and the
        summary of the updates it refused."""
        if self._refused_at_start:
            more = self._refused_at_start - len(self._refused_named)
            log.warning(
                "%s rules updates refused while reading the topic at start (not dead-lettered "
                "again: each was when a replica first read it): %s%s",
                self._refused_at_start,
                "; ".join(self._refused_named),
                f"; and {more} more" if more else "",
            )
        return self.current.summary()

    def _dead_letter(self, message: Message, error: RulesUpdateError, where: str) -> None:
        """Produce the update's dead letter without waiting for it: its delivery report comes
        with a later poll (`_poll_dead_letters`); a failure is logged, never stops the reader."""
        if self._router is None:
            return
        try:
            letter = self._router.dead_letter(message, error)
            if self._producer is None:
                self._producer = Producer(self._kafka)
            self._producer.produce(
                letter.topic,
                key=letter.key,
                value=letter.value,
                headers=cast(Any, letter.headers),
                on_delivery=functools.partial(_delivered, where),
            )
            self._producer.poll(0)
        except Exception:  # BufferError (the queue full), KafkaException: logged, never raised
            log.exception("the dead letter of the rules update at %s was not sent", where)

    def _poll_dead_letters(self, _read_some: bool) -> None:
        """Serve the delivery reports of the dead letters in flight (after every read)."""
        if self._producer is not None:
            self._producer.poll(0)


def _delivered(where: str, error: KafkaError | None, _message: Message) -> None:
    if error is not None:
        log.error(
            "the dead letter of the rules update at %s was not delivered: %s", where, error.str()
        )
