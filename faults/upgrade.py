"""7. A rolling upgrade from a release (`make upgrade-check`): the release's features worker and two
scorer replicas run under load with state of every kind the service keeps, and are replaced one
at a time by this tree's code.

The state, written before the release starts (`History`):
- past transactions (the same simulated cards and terminals as the load's, moved 12 days to 1
  day back) and a label for each card's first fraud: the worker counts them into terminal risk
  and card frauds, and the replicas into their cards' history and its changelog;
- a rule on the rules topic that reviews every transaction over an amount.

Under the load, as docs/upgrading.md says, the readers of the worker's records first: each scorer
replica in turn (SIGTERM, then this tree's replica under the same instance id; exactly-once: the
same transactional id). Then the worker (SIGTERM, then this tree's worker under the same app id,
restoring its tables from the changelogs the release wrote); it is then given the labels of the
other frauds of those cards, so that it counts on top of what it restored.

The checks, beyond the verifier's (nothing lost; nothing duplicated under exactly-once):
- every decision's feature row equals an unbroken run's: this tree's code deciding the same
  input from the beginning, in a group of its own, after the scenario, on the topics the workers
  published (the cards and terminals of the labels given during the load are left out of that
  comparison: their features rightly change when those labels are counted);
- the state reached across: of the decisions this tree's replicas made, those of cards with
  history, at terminals with risk, and of cards with confirmed frauds are counted, and each count
  must be above 0, or the comparison would prove nothing;
- the card frauds the upgraded worker published are those of every label, each counted once;
- the rule hit every transaction over its amount, and no other, before and after.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TypeVar

import msgspec
import numpy as np
from confluent_kafka import Producer

from contracts.card_frauds import decode_card_frauds
from contracts.decision import Decision, decode_features
from contracts.terminal_risk import NUM_TERMINAL_FEATURES, decode_terminal_risk
from contracts.worker_progress import decode_progress, progress_topic_name
from faults.harness import ScenarioRun
from faults.reading import committed_offsets, end_offsets, read_to_end
from faults.replicas import Replica
from faults.timing import Timing
from scorer.features import NUM_TRANSACTION_FEATURES
from scorer.history import NUM_HISTORY_FEATURES
from scorer.terminal_risk import TerminalRisk, fresh_frauds, terminal_features
from simulator.transactions import TransactionSimulator

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
UNBROKEN_TIMEOUT_S = 240.0
#: Columns of a feature row, by kind.
_TERMINAL_START = NUM_TRANSACTION_FEATURES + NUM_HISTORY_FEATURES
_CARD_FRAUDS_START = _TERMINAL_START + NUM_TERMINAL_FEATURES
_COMPACTED = {"cleanup.policy": "compact"}
_Record = TypeVar("_Record")


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


def _label(record: dict[str, object], reported_at: int) -> dict[str, object]:
    return {
        "transaction_id": record["transaction_id"],
        "card_id": record["card_id"],
        "fraud": True,
        "event_time": record["event_time"],
        "reported_at": reported_at,
        "terminal_id": record["terminal_id"],
    }


def rolling_upgrade(run: ScenarioRun, t: Timing) -> None:
    """7. The release's worker and replicas under load with state, replaced one at a time by
    this tree's code."""
    release = run.settings.release
    if release is None:
        raise RuntimeError("scenario 7 needs a release to upgrade from (--release-root)")
    history = History(run, t.history_records)
    worker = run.worker("w", history.worker_args(str(run.log_dir / "w-release")), release)
    counted_s = history.wait_counted(history.newest_ms)
    run.result.figures["history_counted_s"] = f"{counted_s:.1f}"
    extra = history.scorer_args()
    replicas = {name: run.replica(name, *extra, release=release) for name in "ab"}
    run.wait_assigned(list(replicas.values()))
    run.start_load()
    time.sleep(t.warm_s)
    # The readers of the worker's records first, then the worker (docs/upgrading.md).
    for name in "ab":
        with run.fault(f"{name} upgraded"):
            replicas[name].stop()
            replicas[name] = run.replica(name, *extra)
            run.wait_assigned(list(replicas.values()))
    upgraded_ms = time.time_ns() // 1_000_000
    with run.fault("worker upgraded"):
        worker.stop()
        worker = run.worker("w", history.worker_args(str(run.log_dir / "w-tree")))
        run.wait_until(worker.ready, WORKER_READY_TIMEOUT_S, "this tree's worker ready")
    labelled_ms = history.give_later_labels()
    time.sleep(t.tail_s)
    run.topic_checks.append(lambda _i, _d: _check(run, history, labelled_ms, upgraded_ms))


class _Input(msgspec.Struct):
    transaction_id: str
    card_id: str
    terminal_id: str | None = None
    amount: float = 0.0


def _check(run: ScenarioRun, history: History, labelled_ms: int, upgraded_ms: int) -> None:
    """The checks of the scenario's docstring, once the load is over and the group drained."""
    result = run.result
    history.wait_counted(labelled_ms)
    _check_card_frauds(run, history)
    _check_terminal_risk(run, history)
    inputs = _inputs(run)
    upgraded = _decisions(run, run.output_topic)
    unbroken = _unbroken_run(run, history)
    late_cards, late_terminals = history.late_cards_and_terminals()
    compared = differing = 0
    after = {"decisions": 0, "card_history": 0, "terminal_risk": 0, "card_frauds": 0}
    examples: list[str] = []
    for transaction_id, decision in upgraded.items():
        seen = inputs.get(transaction_id)
        if seen is None or seen.card_id in late_cards or seen.terminal_id in late_terminals:
            continue
        row = decode_features(decision.features)
        other = unbroken.get(transaction_id)
        compared += 1
        if other is None or not np.array_equal(row, decode_features(other.features)):
            differing += 1
            if len(examples) < 3:
                examples.append(transaction_id)
        if decision.decided_at >= upgraded_ms:
            after["decisions"] += 1
            after["card_history"] += decision.card_id in history.cards
            after["terminal_risk"] += bool(row[_TERMINAL_START:_CARD_FRAUDS_START].any())
            after["card_frauds"] += bool(row[_CARD_FRAUDS_START:].any())
    result.figures["features_compared"] = str(compared)
    result.check(
        "features equal to an unbroken run's",
        compared > 0 and differing == 0,
        f"{differing} of {compared} differ (e.g. {examples})",
    )
    result.figures.update({f"after_upgrade_{k}": str(v) for k, v in after.items()})
    result.check(
        "decisions after the upgrade read state built before it",
        all(after.values()),
        ", ".join(f"{k} {v}" for k, v in after.items()),
    )
    wrong = [
        i
        for i, d in upgraded.items()
        if i in inputs and (RULE_HIT in d.rules) != (inputs[i].amount > RULE_AMOUNT)
    ]
    hits = sum(RULE_HIT in d.rules for d in upgraded.values())
    result.figures["rule_hits"] = str(hits)
    result.check("the rule hit exactly what it matches", hits > 0 and not wrong, f"{wrong[:3]}")


def _check_card_frauds(run: ScenarioRun, history: History) -> None:
    """Every card's published frauds, as the scorer reads them today, are those of its labels,
    each counted once."""
    today = time.time_ns() // 1_000_000 // DAY_MS
    expected: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for card, _, day in history.frauds:
        expected[card][day] += 1
    published = _latest(run, history.card_frauds_topic, decode_card_frauds)
    wrong = []
    for card in expected.keys() | published.keys():
        days = expected.get(card, {})
        want = _fresh(list(days), list(days.values()), today)
        record = published.get(card)
        got = _fresh([], [], today) if record is None else _fresh(record.days, record.frauds, today)
        if not np.array_equal(want, got):
            wrong.append(card)
    run.result.figures["cards_with_frauds"] = str(len(expected))
    run.result.check(
        "the upgraded worker's card frauds count every label once",
        bool(expected) and not wrong,
        f"{len(wrong)} cards differ, e.g. {wrong[:3]}",
    )


def _check_terminal_risk(run: ScenarioRun, history: History) -> None:
    """Every terminal's published risk, as the scorer reads it today, is that of its past
    transactions and of every label, each counted once: a worker that lost what it counted
    before the upgrade, or counted it again, publishes other windows."""
    today = np.array([time.time_ns() // 1_000_000 // DAY_MS], np.int64)
    expected: dict[str, TerminalRisk] = defaultdict(TerminalRisk)
    for terminal, day in history.terminal_days:
        expected[terminal].add_transaction(day)
    for _, terminal, day in history.frauds:
        expected[terminal].add_label(day, fraud=True)
    published = _latest(run, history.risk_topic, decode_terminal_risk)
    wrong = [
        terminal
        for terminal, risk in expected.items()
        if not np.array_equal(
            risk.features(int(today[0])), terminal_features(published, [terminal], today)[0]
        )
    ]
    run.result.figures["terminals_checked"] = str(len(expected))
    run.result.check(
        "the upgraded worker's terminal risk counts every transaction and label once",
        not wrong,
        f"{len(wrong)} terminals differ, e.g. {wrong[:3]}",
    )


def _latest(run: ScenarioRun, topic: str, decode: Callable[[bytes], _Record]) -> dict[str, _Record]:
    """The latest record of each key of a compacted topic (a tombstone removes it)."""
    latest: dict[str, _Record] = {}
    for message in read_to_end(run.bootstrap, topic, 60):
        key, value = (message.key() or b"").decode(), message.value()
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = decode(value)
    return latest


def _fresh(days: Iterable[int], frauds: Iterable[int], today: int) -> np.ndarray:
    d = np.array([list(days)], np.int64).reshape(1, -1)
    f = np.array([list(frauds)], np.int64).reshape(1, -1)
    return fresh_frauds(d, f, np.array([today], np.int64))


def _inputs(run: ScenarioRun) -> dict[str, _Input]:
    decode = msgspec.json.Decoder(_Input).decode
    found = {}
    for message in read_to_end(run.bootstrap, run.input_topic, 120):
        try:
            record = decode(message.value() or b"")
        except msgspec.MsgspecError:
            continue  # the load's malformed records: dead letters
        found[record.transaction_id] = record
    return found


def _decisions(run: ScenarioRun, topic: str) -> dict[str, Decision]:
    """The first decision of each transaction on `topic`."""
    decode = msgspec.json.Decoder(Decision).decode
    found: dict[str, Decision] = {}
    for message in read_to_end(run.bootstrap, topic, 120):
        decision = decode(message.value() or b"")
        found.setdefault(decision.transaction_id, decision)
    return found


def _unbroken_run(run: ScenarioRun, history: History) -> dict[str, Decision]:
    """This tree's code deciding the whole input from the beginning, in a group of its own."""
    group = f"{run.group}-unbroken"
    output, dlq = f"{run.output_topic}-unbroken", f"{run.dlq_topic}-unbroken"
    changelog = f"{group}-card-state-changelog"
    run.create_topics([output, dlq])
    run.extra_topics += [output, dlq, changelog]
    args = [
        *("--bootstrap-servers", run.bootstrap, "--group-id", group),
        *("--input-topic", run.input_topic, "--output-topic", output, "--dlq-topic", dlq),
        *("--processing-guarantee", run.settings.mode, "--state-changelog-topic", changelog),
        *history.scorer_args(),
    ]
    replica = Replica("unbroken", args, run.log_dir / "unbroken.log").start()
    run.workers.append(replica)
    ends = end_offsets(run.bootstrap, run.input_topic)
    partitions = run.settings.partitions
    run.wait_until(
        lambda: committed_offsets(run.bootstrap, group, run.input_topic, partitions) == ends,
        UNBROKEN_TIMEOUT_S,
        "the unbroken run decided the input",
    )
    replica.stop()
    return _decisions(run, output)
