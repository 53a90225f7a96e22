"""The state a rolling upgrade (fault scenario 7, faults/upgrade.py) starts from, written before
the release runs: the worker's and the rules' topics, past transactions of the load's own cards
and terminals, their frauds' labels, a rule; and how to run the worker and the replicas on them."""

from __future__ import annotations

import logging
import time

import msgspec
import numpy as np
from confluent_kafka import Producer

from contracts.worker_progress import decode_progress, progress_topic_name
from faults.harness import ScenarioRun
from faults.reading import read_to_end
from faults.replicas import Replica
from simulator.transactions import TransactionSimulator
from terminals.card_table_migration import FORMER_CARD_TABLE_NAME
from terminals.topics import CARD_TABLE_NAME, TABLE_NAME, changelog_topic_name, events_topic_name

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
#: The history lies between these many days back and one day back: terminal windows end 7 days
#: back, fresh-label windows read the last 7 days, so both have something to read.
HISTORY_DAYS_BACK = 12
#: The rule the scenario writes, and the amount over which it reviews a transaction.
RULE_NAME = "upgrade-check"
RULE_AMOUNT = 100
#: How a decision names the rule when it hits.
RULE_HIT = f"rule:{RULE_NAME}"
#: The features worker's table partitions (the input's partitions come from the run).
TABLE_PARTITIONS = 3
WORKER_READY_TIMEOUT_S = 180.0
_COMPACTED = {"cleanup.policy": "compact"}


class History:
    """The topics of the worker and the rules, and the state written to them before the release
    starts: past transactions, their frauds' labels, the rule."""

    def __init__(self, run: ScenarioRun, records: int) -> None:
        self.run = run
        name = run.group
        self.labels_topic = f"{name}-labels"
        self.risk_topic = f"{name}-terminal-risk"
        self.card_frauds_topic = f"{name}-card-frauds"
        self.rules_topic = f"{name}-rules"
        self.worker_dlq = f"{name}-features.dlq"
        self.app_id = f"{name}-features"
        run.create_topics([self.labels_topic, self.worker_dlq])
        run.create_topics([self.risk_topic, self.card_frauds_topic, self.rules_topic], _COMPACTED)
        run.extra_topics += [
            *(self.labels_topic, self.worker_dlq, self.risk_topic, self.card_frauds_topic),
            *(self.rules_topic, progress_topic_name(self.risk_topic)),
            events_topic_name(self.app_id),
            *(changelog_topic_name(self.app_id, t) for t in (TABLE_NAME, CARD_TABLE_NAME)),
            changelog_topic_name(self.app_id, FORMER_CARD_TABLE_NAME),
            f"{self.app_id}-__assignor-__leader",  # faust's own
        ]
        self._producer = Producer({"bootstrap.servers": run.bootstrap, "enable.idempotence": True})
        #: Labels still to give (during the load), and every label given: (card, terminal,
        #: transaction day) of each fraud.
        self._later: list[dict[str, object]] = []
        self.frauds: list[tuple[str, str, int]] = []
        #: The cards of the past transactions: every later decision of one reads their history.
        self.cards: set[str] = set()
        #: Each past transaction's terminal and day, as the worker must have counted them.
        self.terminal_days: list[tuple[str, int]] = []
        self.newest_ms = self._write(records)

    def _write(self, count: int) -> int:
        """The past transactions (the load's first `count`, moved back), the labels of each
        card's first fraud and the rule; returns the newest time written (epoch ms)."""
        # The load's own simulator and seed (faults/load.py): its cards and terminals.
        seed = self.run.settings.seed
        batch = TransactionSimulator(seed, id_prefix=f"f{seed}").generate(count)
        times = np.array([int(str(r["event_time"])) for r in batch.records], np.int64)
        now_ms = time.time_ns() // 1_000_000
        start = now_ms - HISTORY_DAYS_BACK * DAY_MS
        span = max(int(times[-1] - times[0]), 1)
        moved = start + (times - times[0]) * ((HISTORY_DAYS_BACK - 1) * DAY_MS) // span
        labels = []
        for i, record in enumerate(batch.records):
            record = {**record, "transaction_id": f"history-{i}", "event_time": int(moved[i])}
            self._send(self.run.input_topic, str(record["card_id"]), record)
            self.cards.add(str(record["card_id"]))
            self.terminal_days.append((str(record["terminal_id"]), int(moved[i]) // DAY_MS))
            if batch.is_fraud[i]:
                reported = min(int(moved[i]) + 3_600_000, now_ms - 60_000)
                labels.append(_label(record, reported))
        # Each card's first fraud now, its others after the worker's upgrade: the upgraded
        # worker then counts on top of what it restored, for the same cards and terminals.
        firsts: set[str] = set()
        given: list[dict[str, object]] = []
        for label in labels:
            card = str(label["card_id"])
            (self._later if card in firsts else given).append(label)
            firsts.add(card)
        for label in given:
            self._give(label)
        rule = {"when": f"amount > {RULE_AMOUNT}", "then": "review"}
        self._send(self.rules_topic, f"rule:{RULE_NAME}", rule)
        self._flush()
        log.info(
            "history: %s transactions, %s labels given, %s kept",
            count,
            len(given),
            len(self._later),
        )
        return max(int(moved[-1]), max((int(str(x["reported_at"])) for x in given), default=0))

    def give_later_labels(self) -> int:
        """The labels kept back, reported now; returns when (epoch ms)."""
        now_ms = time.time_ns() // 1_000_000
        for label in self._later:
            self._give({**label, "reported_at": now_ms})
        self._flush()
        return now_ms

    def late_cards_and_terminals(self) -> tuple[set[str], set[str]]:
        """The cards and terminals of the labels given during the load."""
        return {str(x["card_id"]) for x in self._later}, {
            str(x["terminal_id"]) for x in self._later
        }

    def _give(self, label: dict[str, object]) -> None:
        self._send(self.labels_topic, str(label["card_id"]), label)
        day = int(str(label["event_time"])) // DAY_MS
        self.frauds.append((str(label["card_id"]), str(label["terminal_id"]), day))

    def _send(self, topic: str, key: str, value: object) -> None:
        while True:
            try:
                self._producer.produce(topic, msgspec.json.encode(value), key.encode())
                return
            except BufferError:
                self._producer.poll(0.05)

    def _flush(self) -> None:
        left = self._producer.flush(60)
        if left:
            raise RuntimeError(f"history: {left} records not acknowledged")

    # -- the processes -------------------------------------------------------------------

    def worker_args(self, data_dir: str) -> list[str]:
        return [
            *("--bootstrap-servers", self.run.bootstrap, "--app-id", self.app_id),
            *("--input-topic", self.run.input_topic, "--labels-topic", self.labels_topic),
            *("--terminal-risk-topic", self.risk_topic, "--dlq-topic", self.worker_dlq),
            *("--card-frauds-topic", self.card_frauds_topic),
            *("--table-partitions", str(TABLE_PARTITIONS), "--data-dir", data_dir),
        ]

    def scorer_args(self) -> tuple[str, ...]:
        return (
            *(
                "--terminal-risk-topic",
                self.risk_topic,
                "--card-frauds-topic",
                self.card_frauds_topic,
            ),
            *("--rules-topic", self.rules_topic, "--decision-features", "on"),
        )

    def wait_counted(self, until_ms: int, timeout_s: float = WORKER_READY_TIMEOUT_S) -> float:
        """Until the worker says (its progress topic) that every table partition has counted
        and published everything up to `until_ms`; returns the seconds it took."""
        topic = progress_topic_name(self.risk_topic)

        def counted() -> bool:
            alive(self.run.workers)
            reached: dict[int, int] = {}
            partitions = TABLE_PARTITIONS
            try:
                for message in read_to_end(self.run.bootstrap, topic, 30):
                    progress = decode_progress(message.value())
                    partitions, partition = progress.partitions, progress.partition
                    reached[partition] = max(reached.get(partition, -1), progress.counted_to)
            except RuntimeError:  # the worker has not made the topic yet
                return False
            return len(reached) == partitions and min(reached.values()) >= until_ms

        return self.run.wait_until(counted, timeout_s, f"worker counted up to {until_ms}")


def alive(processes: list[Replica]) -> bool:
    """True while every one of `processes` that has not been stopped on purpose runs; a
    RuntimeError with the end of its log when one has exited."""
    for process in processes:
        if not process.retired and not process.alive:
            raise RuntimeError(f"{process.name} exited:\n{process.log_tail(3_000)}")
    return True


def _label(record: dict[str, object], reported_at: int) -> dict[str, object]:
    return {
        "transaction_id": record["transaction_id"],
        "card_id": record["card_id"],
        "fraud": True,
        "event_time": record["event_time"],
        "reported_at": reported_at,
        "terminal_id": record["terminal_id"],
    }
