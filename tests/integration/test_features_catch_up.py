"""`fraud-features` catching up on a backlog counts every event as an unbroken live run does
(issue 44, item 0).

A payment team starts the service on its history: weeks of transactions, then the confirmed
frauds reported so far, then the worker. The small labels topic can be read to its end long
before the transactions; a worker whose clock moved with whatever it read first took every
older transaction for stale and forgot its terminals. Here the same simulated records go to two
workers on topics of their own. One reads them live: produced two days at a time, transactions
and labels interleaved in event-time order, each step routed before the next is produced. The
other catches up: half the history, then its labels, then the worker starts; it stops, and the
rest comes the same way while it is down (an outage), then it starts again. Their counts and
their published terminal risk and card frauds must be the same, record for record, and neither
may drop anything as stale.

The same holds when partitions move under the live run's load: a second replica joins while the
first routes, and the first is killed while a step waits to be routed; the survivor's published
records equal those of one worker that read the same records undisturbed.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from contracts.card_frauds import decode_card_frauds
from contracts.terminal_risk import HORIZON_DAYS, MS_PER_DAY, decode_terminal_risk
from simulator.transactions import TransactionSimulator
from terminals.events import decode_batch, partition_of
from terminals.metrics import STAGES
from terminals.router import router_group
from terminals.topics import CARD_TABLE_NAME, changelog_topic_name, events_topic_name
from terminals.unpublished import PUBLISH_WITHIN_DAYS
from tests.integration.conftest import BOOTSTRAP, committed_offsets, end_offsets
from tests.integration.features_worker import DAY0, PARTITIONS, WorkerProcess, WorkerTopics

#: Enough history that the labels topic ends more than every window (HORIZON_DAYS) after the
#: first transactions, and enough transactions that they take several fetches to read; few
#: cards and terminals, so both workers count it in well under a minute.
DAYS = 100
CARDS, TERMINALS = 150, 300
SEED = 44
#: The catch-up run's worker is down from this many days into the history on.
OUTAGE_AFTER_DAYS = 47
#: The live run's producer waits for the router after every this many days (less than the
#: 7-day label delay; 0.8 s a step here).
LIVE_STEP_DAYS = 4
DONE_TIMEOUT_S = 240.0
#: FRAUD_FEATURES_INPUT_WAIT_MS of a worker fed a step at a time (the live runs).
LIVE_INPUT_WAIT_MS = 500
#: Longer than the worker's publish interval (FRAUD_FEATURES_PUBLISH_INTERVAL_MS, 1 s): once
#: the internal topic has been applied to its end that long, the last round has published.
QUIET_S = 2.5

#: (key, value, partition or None, event-time order key).
_Record = tuple[bytes, bytes, int | None, int]


class History:
    """The simulated records, in the order each run produces them."""

    def __init__(self) -> None:
        simulator = TransactionSimulator(
            SEED,
            num_cards=CARDS,
            num_terminals=TERMINALS,
            start_time_ms=DAY0 * MS_PER_DAY,
            fraud_scale=0.3,
        )
        batch = simulator.generate(int(simulator.natural_rate_per_s * 86_400 * DAYS))
        self.transactions: list[_Record] = [
            (str(r["card_id"]).encode(), msgspec.json.encode(r), None, int(str(r["event_time"])))
            for r in batch.records
        ]
        # The outcomes known by the last transaction: reported days after their transactions.
        self.labels: list[_Record] = [
            (str(r["card_id"]).encode(), msgspec.json.encode(r), None, int(str(r["reported_at"])))
            for r in batch.labels
        ]
        self.last_day = int(batch.columns.event_time[-1]) // MS_PER_DAY
        self.closing_day = self.last_day + PUBLISH_WITHIN_DAYS
        # A day PUBLISH_WITHIN_DAYS after the last begins on every transactions partition, at a
        # terminal of every table partition: each run's clock then passes every day far enough
        # everywhere that every terminal's counts are published (the day close), and the
        # records compare whole.
        closing: list[_Record] = []
        for table_partition in range(PARTITIONS):
            terminal = next(
                f"close-{i}"
                for i in range(1_000)
                if partition_of(f"close-{i}", PARTITIONS) == table_partition
            )
            for partition in range(PARTITIONS):
                record = {
                    "transaction_id": f"close-{table_partition}-{partition}",
                    "card_id": "close",
                    "merchant_id": "m-close",
                    "terminal_id": terminal,
                    "amount": 1.0,
                    "currency": "EUR",
                    "mcc": 5411,
                    "country": "DE",
                    "channel": "pos",
                    "card_present": True,
                    "event_time": self.closing_day * MS_PER_DAY + 3_600_000,
                }
                closing.append((b"close", msgspec.json.encode(record), partition, 0))
        self.closing: list[_Record] = closing

    @property
    def first_day(self) -> int:
        return self.transactions[0][3] // MS_PER_DAY

    def between(self, since_day: int, until_day: int) -> tuple[list[_Record], list[_Record]]:
        """The transactions of the days from `since_day` until `until_day` (excluded), and the
        labels reported on them."""
        since, until = since_day * MS_PER_DAY, until_day * MS_PER_DAY
        return (
            [r for r in self.transactions if since <= r[3] < until],
            [r for r in self.labels if since <= r[3] < until],
        )


@pytest.fixture(scope="module")
def history() -> History:
    return History()


@pytest.fixture
def worker_topics_factory(admin: AdminClient) -> Iterator[Callable[[], WorkerTopics]]:
    made: list[WorkerTopics] = []

    def make() -> WorkerTopics:
        suffix = uuid.uuid4().hex[:10]
        topics = WorkerTopics(
            f"tx-{suffix}",
            f"labels-{suffix}",
            f"risk-{suffix}",
            f"tx-{suffix}.dlq",
            f"ff-{suffix}",
            f"cards-{suffix}",
        )
        compact = {"cleanup.policy": "compact"}
        new = [NewTopic(n, PARTITIONS, 1) for n in (topics.transactions, topics.dlq, topics.labels)]
        outputs = (topics.risk, topics.card_frauds, topics.progress)
        new += [NewTopic(n, 1, 1, config=compact) for n in outputs]
        for future in admin.create_topics(new).values():
            future.result(timeout=30)
        made.append(topics)
        return topics

    yield make
    existing = set(admin.list_topics(timeout=30).topics)
    for topics in made:
        names = [topics.transactions, topics.dlq, topics.labels, topics.risk, topics.card_frauds]
        names.append(topics.progress)
        names += [events_topic_name(topics.app_id), changelog_topic_name(topics.app_id)]
        names.append(changelog_topic_name(topics.app_id, CARD_TABLE_NAME))
        gone = [n for n in names if n in existing]
        for future in admin.delete_topics(gone).values():
            future.result(timeout=30)


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(topics: WorkerTopics, input_wait_ms: int = 5_000) -> WorkerProcess:
        log = tmp_path / f"{topics.app_id}.log"
        # Idle entries looked for every second, in both runs alike; the table written every
        # second, so that each run's last commit comes soon after its last record. A worker on
        # a backlog keeps the default wait for a partition with nothing queued: with 500 ms,
        # the router, busy routing the backlog, left partitions unread that long, counted them
        # idle, and the catch-up below dropped 489 transactions and 27 labels as stale.
        worker = WorkerProcess(
            topics,
            log,
            tmp_path / topics.app_id,
            extra=("--evict-interval-s", "1", "--write-interval-ms", "1000"),
            input_wait_ms=input_wait_ms,
        ).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        if worker.process.poll() is None:
            worker.process.terminate()
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()


def _produce(topics: WorkerTopics, transactions: list[_Record], labels: list[_Record]) -> None:
    """Produce in the order given by event time (a label's: when it was reported), and wait
    until all are acknowledged."""
    producer = Producer(
        {"bootstrap.servers": BOOTSTRAP, "linger.ms": 5, "enable.idempotence": True}
    )
    merged = sorted(
        [(r[3], 0, topics.transactions, r) for r in transactions]
        + [(r[3], 1, topics.labels, r) for r in labels],
        key=lambda item: (item[0], item[1]),
    )
    for _at, _kind, topic, (key, value, partition, _time) in merged:
        while True:
            try:
                if partition is None:
                    producer.produce(topic, value, key)
                else:
                    producer.produce(topic, value, key, partition=partition)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(30) == 0


def _wait_routed(topics: WorkerTopics, worker: WorkerProcess, timeout_s: float) -> None:
    """Until the router has committed every input record produced so far."""
    group = router_group(topics.app_id)
    deadline = time.monotonic() + timeout_s
    for topic in (topics.transactions, topics.labels):
        ends = end_offsets(topic, PARTITIONS)
        while True:
            committed = committed_offsets(group, topic, PARTITIONS)
            if all(end == 0 or committed[p] >= end for p, end in ends.items()):
                break
            assert worker.process.poll() is None, worker.log()[-4000:]
            assert time.monotonic() < deadline, f"{topic}: routed {committed} of {ends}"
            time.sleep(0.1)


def _wait_counted(topics: WorkerTopics, worker: WorkerProcess) -> None:
    """Until every input record is routed and every re-keyed event applied and committed by the
    table agent (faust flushes what it published before it commits), and the agent's last round
    of publications (one every FRAUD_FEATURES_PUBLISH_INTERVAL_MS) is over."""
    _wait_routed(topics, worker, DONE_TIMEOUT_S)
    internal = events_topic_name(topics.app_id)
    # Every record routed is below these ends. Later records are the router's marks alone, sent
    # to a quiet partition every half write interval: the commit need not catch them.
    ends = end_offsets(internal, PARTITIONS)
    deadline = time.monotonic() + DONE_TIMEOUT_S
    caught_up_since = None
    taken: list[float] = []
    while True:
        committed = committed_offsets(topics.app_id, internal, PARTITIONS)
        # And the worker's own counts still: a loaded CI run once read counts 99 short of what
        # its table held (the published records were equal), with the offsets committed.
        now = [_metric(worker, name) for name in STALE + COUNTED]
        if all(end == 0 or committed[p] >= end for p, end in ends.items()) and now == taken:
            caught_up_since = caught_up_since or time.monotonic()
            if time.monotonic() - caught_up_since > QUIET_S:
                return
        else:
            caught_up_since, taken = None, now
        assert worker.process.poll() is None, worker.log()[-4000:]
        assert time.monotonic() < deadline, f"table agent committed {committed} of {ends}"
        time.sleep(0.5)


#: A published record, comparable: (as_of_day, (day, counts…) per bucket with a count).
_Published = tuple[int, tuple[tuple[float, ...], ...]]


def _runs_routed(app_id: str) -> tuple[int, int]:
    """The transaction runs on the worker's internal topic (the combiner's), and the
    transactions they hold."""
    topic = events_topic_name(app_id)
    partitions = PARTITIONS  # the workers' --table-partitions (features_worker.py)
    ends = end_offsets(topic, partitions)
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"r-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    read = dict.fromkeys(range(partitions), 0)
    runs = transactions = 0
    deadline = time.monotonic() + 60
    try:
        while any(read[p] < ends[p] for p in read):
            assert time.monotonic() < deadline, f"{topic}: read {read} of {ends}"
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                read[message.partition() or 0] = (message.offset() or 0) + 1
                batch = decode_batch(message.value())
                runs += len(batch.runs)
                transactions += sum(len(run.offsets) for _, run in batch.runs)
    finally:
        consumer.close()
    return runs, transactions


def _published(topic: str, *, cards: bool) -> dict[str, _Published | None]:
    """The latest record of each key of a compacted output topic (None: a tombstone)."""
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    ends = end_offsets(topic, 1)
    consumer.assign([TopicPartition(topic, 0, 0)])
    latest: dict[str, _Published | None] = {}
    read = 0
    deadline = time.monotonic() + 60
    try:
        while read < ends[0]:
            assert time.monotonic() < deadline, f"{topic}: read {read} of {ends[0]}"
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                read = (message.offset() or 0) + 1
                key, value = (message.key() or b"").decode(), message.value()
                if value is None:
                    latest[key] = None
                elif cards:
                    card = decode_card_frauds(value)
                    rows = zip(card.days.tolist(), card.frauds.tolist(), strict=True)
                    latest[key] = (card.as_of_day, tuple((d, c) for d, c in rows if c))
                else:
                    record = decode_terminal_risk(value)
                    assert record.buckets is not None
                    days, counts = record.buckets
                    rows = zip(days.tolist(), counts.tolist(), strict=True)
                    latest[key] = (record.as_of_day, tuple((d, *c) for d, c in rows if any(c)))
    finally:
        consumer.close()
    return latest


def _read(latest: dict[str, _Published | None], final_day: int) -> dict[str, _Published]:
    """What a scorer reads from the records as of `final_day` on. An idle entry (no window
    reads any of its days again) is forgotten when the worker next looks for idle entries, once
    a second of wall-clock time: so whether a run left its record, its tombstone or, for an
    entry that came back, a record without its old counts, depends on when it looked. Neither
    an idle record nor counts older than every window as of a record's own day are read."""
    read = {}
    for key, record in latest.items():
        if record is None:
            continue
        as_of_day, rows = record
        kept = tuple(sorted(row for row in rows if row[0] >= as_of_day - HORIZON_DAYS))
        if kept and max(as_of_day, int(kept[-1][0])) >= final_day - HORIZON_DAYS:
            read[key] = (as_of_day, kept)
    return read


def _metric(worker: WorkerProcess, sample: str) -> float:
    """A counter's value; 0 while it has no sample (a labelled counter never incremented)."""
    values = {s.key: s.value for s in worker.samples(sample.split("{")[0])}
    return values.get(sample, 0.0)


STALE = (
    'fraud_features_terminal_events_total{result="stale",source="transaction"}',
    'fraud_features_terminal_events_total{result="stale",source="label"}',
    'fraud_features_card_events_total{result="stale"}',
)
COUNTED = (
    'fraud_features_terminal_events_total{result="counted",source="transaction"}',
    'fraud_features_terminal_events_total{result="counted",source="label"}',
    'fraud_features_card_events_total{result="counted"}',
)


def test_a_worker_catching_up_on_history_then_labels_counts_as_a_live_run(
    history: History,
    worker_topics_factory: Callable[[], WorkerTopics],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    first, last = history.first_day, history.last_day
    outage = first + OUTAGE_AFTER_DAYS
    # Each catch-up reads labels reported more than every window ahead of its first days.
    assert last - outage > HORIZON_DAYS + 5 and outage - first > HORIZON_DAYS + 5

    # Live: the worker runs while the days are produced, each routed before the next.
    live_topics = worker_topics_factory()
    # Each step is routed before the next: a short wait, or every step's last records would
    # wait 5 s for a quiet partition.
    live = start_worker(live_topics, input_wait_ms=LIVE_INPUT_WAIT_MS)
    live.wait_ready()
    for day in range(first, last + 1, LIVE_STEP_DAYS):
        _produce(live_topics, *history.between(day, day + LIVE_STEP_DAYS))
        _wait_routed(live_topics, live, 60.0)
    _produce(live_topics, history.closing, [])
    _wait_counted(live_topics, live)
    expected = {name: _metric(live, name) for name in STALE + COUNTED}
    # Every stage's CPU is measured (bench/worker_cost.py reads it), and publications are
    # coalesced: fewer records than the events that could each have moved one.
    for stage in STAGES:
        assert _metric(live, f'fraud_features_stage_cpu_seconds_total{{stage="{stage}"}}') > 0
    published = _metric(live, 'fraud_features_risk_published_total{kind="features"}')
    assert 0 < published < expected[COUNTED[0]] / 2

    # Catch-up: the history up to the outage, then its labels, then the worker starts and
    # catches up; it stops, and while it is down the rest comes the same way.
    backlog_topics = worker_topics_factory()
    counted = dict.fromkeys(STALE + COUNTED, 0.0)
    for since, until in ((first, outage), (outage, last + 1)):
        transactions, labels = history.between(since, until)
        _produce(backlog_topics, transactions, [])
        if until > last:
            _produce(backlog_topics, history.closing, [])
        _produce(backlog_topics, [], labels)
        backlog = start_worker(backlog_topics)
        _wait_counted(backlog_topics, backlog)
        for name in counted:
            counted[name] += _metric(backlog, name)
        backlog.process.terminate()
        assert backlog.process.wait(timeout=30) == 0, backlog.log()[-4000:]

    counts = {name: (counted[name], expected[name]) for name in STALE + COUNTED}
    final_day = history.closing_day
    differences = {}
    for name, cards in (("risk", False), ("card_frauds", True)):
        caught_up = _read(_published(getattr(backlog_topics, name), cards=cards), final_day)
        wanted = _read(_published(getattr(live_topics, name), cards=cards), final_day)
        assert wanted, f"the live run published no {name}"
        wrong = sorted(k for k in set(caught_up) | set(wanted) if caught_up.get(k) != wanted.get(k))
        differences[name] = f"{len(wrong)} of {len(wanted)}, e.g. {wrong[:3]}"
    summary = f"(catch-up, live) {counts}; keys whose records differ: {differences}"
    for name in STALE:
        assert counts[name] == (0, 0), summary
    for name in COUNTED:
        assert counts[name][0] == counts[name][1], summary
    assert all(d.startswith("0 of") for d in differences.values()), summary


def test_a_replica_joining_and_one_killed_while_it_routes_count_as_one_worker_alone(
    history: History,
    worker_topics_factory: Callable[[], WorkerTopics],
    start_worker: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    # The live run's load (LIVE_STEP_DAYS at a time), on two replicas: the second joins while
    # the first routes a step, and the first is killed (-9) just after the next step is
    # produced. Partitions move twice while records wait, and what the first had routed or
    # applied but not committed is read again by the second. The survivor's records must be
    # those of one worker that read the same records undisturbed, and nothing stale. The
    # second runs the combiner (FRAUD_FEATURES_COMBINE=on, as a restart that turns it on
    # would): it routes again as runs what the first routed as events and its table may have
    # applied, and each transaction must still count once.
    first, last = history.first_day, history.last_day
    steps = list(range(first, last + 1, LIVE_STEP_DAYS))
    join_at, kill_at = steps[len(steps) // 3], steps[2 * len(steps) // 3]

    alone_topics = worker_topics_factory()
    _produce(alone_topics, *history.between(first, last + 1))
    _produce(alone_topics, history.closing, [])
    alone = start_worker(alone_topics)
    _wait_counted(alone_topics, alone)

    moved_topics = worker_topics_factory()
    a, b = (
        WorkerProcess(
            moved_topics,
            tmp_path / f"replica-{name}.log",
            tmp_path / f"replica-{name}",
            extra=("--evict-interval-s", "1", "--write-interval-ms", "1000", "--combine", combine),
            input_wait_ms=LIVE_INPUT_WAIT_MS,
        )
        for name, combine in (("a", "off"), ("b", "on"))
    )
    try:
        a.start().wait_ready()
        survivor = a
        for day in steps:
            _produce(moved_topics, *history.between(day, day + LIVE_STEP_DAYS))
            if day == join_at:
                b.start()  # the group rebalances while a routes this step
            if day == kill_at:
                b.wait_ready()
                a.kill()  # this step waits unrouted: b takes over a's partitions
                survivor = b
            _wait_routed(moved_topics, survivor, 90.0)
        _produce(moved_topics, history.closing, [])
        _wait_counted(moved_topics, b)
        stale = {name: _metric(b, name) for name in STALE}
    finally:
        for worker in (a, b):
            if getattr(worker, "process", None) is not None and worker.process.poll() is None:
                worker.kill()

    assert all(value == 0 for value in stale.values()), f"{stale}\n{b.log()[-3000:]}"
    assert "Worker ready" in a.log() and a.process.returncode == -9
    runs, transactions = _runs_routed(moved_topics.app_id)
    assert runs and transactions > runs, "b routed runs, some of several transactions"
    final_day = history.closing_day
    for name, cards in (("risk", False), ("card_frauds", True)):
        moved = _read(_published(getattr(moved_topics, name), cards=cards), final_day)
        wanted = _read(_published(getattr(alone_topics, name), cards=cards), final_day)
        # The closing terminals only move the clocks. The survivor publishes, in its first
        # round, every entry it took over whose record is not its table's, so one of them may
        # show a count of the closing day that the worker alone had not yet had to publish.
        moved = {k: v for k, v in moved.items() if not k.startswith("close-")}
        wanted = {k: v for k, v in wanted.items() if not k.startswith("close-")}
        assert wanted, f"the worker alone published no {name}"
        wrong = sorted(k for k in set(moved) | set(wanted) if moved.get(k) != wanted.get(k))
        assert not wrong, f"{name}: {len(wrong)} of {len(wanted)} differ, e.g. {wrong[:3]}"


def test_history_produced_while_the_worker_routes_it_counts_everything(
    history: History,
    worker_topics_factory: Callable[[], WorkerTopics],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    # A backfill produced while the worker runs: the router reads each partition to the end of
    # what the broker had a moment ago, while the producer is still writing older days into it.
    # Counted idle at once, such a partition held no clock back, and the clock ran ahead to the
    # others' time: 3 runs of 3 dropped 1-4 labels as stale (and earlier forms of this test
    # 92-240 transactions too). Now it is waited for FRAUD_FEATURES_INPUT_WAIT_MS.
    topics = worker_topics_factory()
    worker = start_worker(topics)
    worker.wait_ready()
    first, last = history.first_day, history.last_day
    third = (last + 1 - first) // 3 + 1
    for since in range(first, last + 1, third):
        _produce(topics, *history.between(since, since + third))
    _produce(topics, history.closing, [])
    _wait_counted(topics, worker)

    stale = {name: _metric(worker, name) for name in STALE}
    assert all(value == 0 for value in stale.values()), f"{stale}\n{worker.log()[-3000:]}"
    counted = _metric(worker, COUNTED[0])
    assert counted == len(history.transactions) + len(history.closing)
