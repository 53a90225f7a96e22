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
An expression rule or segment override (`rule:`, `override:`) that is not confirmed is never
left in force unjudged (list entries name ids, and are judged by the sample or applied at once):
- Read live while the sample is too small to judge by (a replica's first minute, or too little
  traffic), it waits, not applied, until the sample allows (`result="waiting"`), then is judged
  as if read then, in the order read. At most MAX_WAITING wait: past it the oldest is dropped
  (`result="dropped"`, logged: send it again). A confirmed update of its key overtakes it.
- Read at the catch-up at start (where there is no traffic yet) it is applied, so a replica
  starts with the rules the others have, and remembered with the values its key took since its
  last confirmed record (its base: that value, or none; at most MAX_UNJUDGED_VALUES). Once the
  sample allows, they are judged as if read live, in the order read, from the rules with each
  such key at its base: each that would be held is not taken (counted and logged as held), and
  the key ends at the last value taken (its base if none is).

Dead letters never hold the reader: each is produced and its delivery report polled for after
every read, a failure logged from it. The records the topic held at start (the catch-up) are
not dead-lettered again: each was when a replica first read it live. Those refused are counted
(`fraud_rules_updates_total{result="refused_at_start"}`) and named in one summary line.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
from confluent_kafka import KafkaError, Message, Producer

from deadletter.router import DeadLetterRouter
from plumbing.errors import RulesUpdateError
from scorer.columns import TransactionFields
from scorer.decisions import Thresholds
from scorer.rule_sources import topic_key
from scorer.rules import Rules
from stream.compacted_topic import CompactedTopicReader
from stream.metrics import ServiceMetrics
from stream.rules_guard import MIN_SAMPLE_ROWS, Held, RulesGuard

log = logging.getLogger(__name__)

#: How long `close()` waits for the dead letters still in flight.
CLOSE_FLUSH_S = 10.0
#: The refused updates of the catch-up at start that its summary line names (the rest counted).
SUMMARY_NAMED = 5
#: The header (and its value) that confirms an update the guard held.
CONFIRM_HEADER, CONFIRMED = "fraud.rules.confirm", b"yes"
#: The kinds of update that are judged once the sample allows, never applied unjudged: they can
#: flag any share of the traffic (a list entry names ids, and is judged or applied at once).
JUDGED_KINDS = ("rule", "override")
#: Live updates that wait for the guard's sample at most (each at most MAX_UPDATE_BYTES): past
#: it the oldest is dropped.
MAX_WAITING = 100
#: Values a key took at the catch-up since its last confirmed one, kept to be judged (the base
#: and the newest ones; older ones are dropped, so the key may go back further).
MAX_UNJUDGED_VALUES = 4


class _Read(NamedTuple):
    """A value of a key read at the catch-up at start: where ("" for the base), and the how
    many-th record of the catch-up it was."""

    value: bytes | None
    where: str = ""
    order: int = -1


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
        #: With a guard, the rule and override keys whose latest record read at the catch-up
        #: is not confirmed: their base, then the values read since (judged once the sample
        #: allows); and the last confirmed value of each (a base), until the catch-up ends.
        self._unjudged: dict[str, list[_Read]] = {}
        self._confirmed_at_start: dict[str, bytes] = {}
        self._reads_at_start = 0
        #: Rule and override updates read live before the sample allowed judging them.
        self._waiting: deque[Message] = deque()
        self._reader = (
            None
            if topic is None
            else CompactedTopicReader(
                self._kafka,
                topic,
                self._apply,
                name="rules",
                metrics=metrics,
                after_read=self._after_read,
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
        """A record as the reader hands it over: applied, held, waiting, or refused."""
        try:
            name = topic_key(message.key())
            updated = self.current.with_update(name, message.value())
        except Exception as exc:  # RulesError, or whatever else a record provokes
            self._refused(message, exc)
            return
        if self._reader is not None and self._reader.in_catch_up(message):
            self._take(name, updated)
            self._remember_unjudged(message, name)
        elif not self._waits(message, name):
            self._judge_and_take(message, name, updated)

    def _judge_and_take(self, message: Message, name: str, updated: Rules) -> None:
        """A live update: applied unless the guard holds it."""
        try:
            if self._held(message, name, updated):
                return
        except Exception as exc:  # what deciding raises: the update cannot be used
            self._refused(message, exc)
            return
        self._take(name, updated)
        self._unjudged.pop(name, None)  # what its key took at start is superseded

    def _take(self, name: str, updated: Rules) -> None:
        self.current = updated
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
        if _confirmed(message):
            log.warning(
                "rules update %s confirmed (%s): not judged by the guard", name, CONFIRM_HEADER
            )
            return False
        held = guard.check(name, message.value() is not None, self.current, updated)
        if held is None:
            return False
        self._count_held(name, _where(message), held, "")
        return True

    def _count_held(self, name: str, where: str, held: Held, then: str) -> None:
        guard = self._guard
        assert guard is not None
        self._metrics.record_rules_update("held")
        log.error(
            "rules update %s held (%s): it would flag %.1f%% of the last minute's %s "
            "transactions sampled (%.1f%% without it), over FRAUD_RULES_GUARD_SHARE=%s%s; send "
            "it again with the header %s: %s to apply it",
            name,
            where,
            100 * held.share_new,
            held.rows,
            100 * held.share_now,
            guard.share,
            then,
            CONFIRM_HEADER,
            CONFIRMED.decode(),
        )

    # -- updates not judged yet: read at start, or live before the sample allowed -----------

    def _remember_unjudged(self, message: Message, name: str) -> None:
        """A rule or override update applied at the catch-up: remembered to be judged later,
        unless it is confirmed (then it is the base of its key's later ones)."""
        if self._guard is None or name.partition(":")[0] not in JUDGED_KINDS:
            return
        value = message.value()
        if _confirmed(message):
            self._unjudged.pop(name, None)
            if value is None:
                self._confirmed_at_start.pop(name, None)
            else:
                self._confirmed_at_start[name] = value
            return
        reads = self._unjudged.setdefault(name, [_Read(self._confirmed_at_start.get(name))])
        self._reads_at_start += 1
        reads.append(_Read(value, _where(message), self._reads_at_start))
        if value == reads[0].value:
            del self._unjudged[name]  # back to its base: nothing in force is unjudged
        elif len(reads) > MAX_UNJUDGED_VALUES:
            del reads[1]

    def _waits(self, message: Message, name: str) -> bool:
        """Whether a live rule or override update must wait: the sample is too small to judge
        it by (what waits already is judged first, once it is not)."""
        guard = self._guard
        if guard is None or name.partition(":")[0] not in JUDGED_KINDS:
            return False
        if _confirmed(message):  # applied at once: what of its key waits is superseded
            if any(topic_key(waiting.key()) == name for waiting in self._waiting):
                self._waiting = deque(m for m in self._waiting if topic_key(m.key()) != name)
            return False
        if self._judge_waiting():
            return False
        if len(self._waiting) >= MAX_WAITING:
            dropped = self._waiting.popleft()
            self._metrics.record_rules_update("dropped")
            log.error(
                "rules update %s dropped (%s): more than %s updates wait for the guard's sample; "
                "send it again",
                topic_key(dropped.key()),
                _where(dropped),
                MAX_WAITING,
            )
        self._waiting.append(message)
        self._metrics.record_rules_update("waiting")
        log.warning(
            "rules update %s waits (%s): the guard's sample holds %s of the %s rows of the last "
            "minute's traffic it needs to judge it; applied or held then (sent again with the "
            "header %s: %s, at once)",
            name,
            _where(message),
            guard.rows(),
            MIN_SAMPLE_ROWS,
            CONFIRM_HEADER,
            CONFIRMED.decode(),
        )
        return True

    def _judge_waiting(self) -> bool:
        """Judge what was read at start unjudged, then what waits, once the topic is loaded and
        the sample allows; return whether it does."""
        guard = self._guard
        if guard is None or not self.loaded.is_set() or not guard.can_judge():
            return False
        if self._unjudged:
            self._judge_read_at_start()
        while self._waiting:
            message = self._waiting.popleft()
            try:
                name = topic_key(message.key())
                updated = self.current.with_update(name, message.value())
            except Exception as exc:
                self._refused(message, exc)
                continue
            self._judge_and_take(message, name, updated)
        return True

    def _judge_read_at_start(self) -> None:
        """Judge the rule and override updates the catch-up applied unjudged as if read live:
        from the rules in force with each such key at its base, each value in the order read;
        the rules in force become those of the values taken."""
        guard = self._guard
        assert guard is not None
        unjudged, self._unjudged = self._unjudged, {}
        reads = sorted(
            ((name, read) for name, values in unjudged.items() for read in values[1:]),
            key=lambda item: item[1].order,
        )
        held_any = False
        try:
            rules = self.current
            for name, values in unjudged.items():
                rules = rules.with_update(name, values[0].value)
            for name, read in reads:
                after = rules.with_update(name, read.value)
                try:
                    held = guard.check(name, read.value is not None, rules, after)
                except Exception as exc:  # deciding with it fails: it cannot stay in force
                    self._metrics.record_rules_update("held")
                    log.error(
                        "rules update %s (%s) read at start cannot be judged (%s): not in force",
                        name,
                        read.where,
                        exc,
                    )
                    held_any = True
                    continue
                if held is None:
                    rules = after
                else:
                    self._count_held(name, read.where, held, "; read at start, not in force")
                    held_any = True
        except Exception:  # a rules error going back to a base: what is in force stays
            log.exception("the rules updates read at start could not be judged: they stay")
            return
        self.current = rules
        self._metrics.set_rules_entries(len(rules))
        if held_any:
            log.warning(
                "rules in force once the updates read at start were judged: %s", rules.summary()
            )

    def _refused(self, message: Message, error: Exception) -> None:
        """Dead-letter an update read live; count one of the catch-up at start."""
        where = _where(message)
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
        with a later poll (`_after_read`); a failure is logged, never stops the reader."""
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

    def _after_read(self, _read_some: bool) -> None:
        """After every read: serve the delivery reports of the dead letters in flight, and judge
        the updates that wait for the guard's sample, once it allows."""
        if self._producer is not None:
            self._producer.poll(0)
        if self._confirmed_at_start and self.loaded.is_set():
            self._confirmed_at_start.clear()  # bases of the catch-up's records only
        if self._unjudged or self._waiting:
            self._judge_waiting()


def _confirmed(message: Message) -> bool:
    headers = cast(list[tuple[str, bytes | None]], message.headers() or [])
    return (CONFIRM_HEADER, CONFIRMED) in headers


def _where(message: Message) -> str:
    return f"partition={message.partition()} offset={message.offset()}"


def _delivered(where: str, error: KafkaError | None, _message: Message) -> None:
    if error is not None:
        log.error(
            "the dead letter of the rules update at %s was not delivered: %s", where, error.str()
        )
