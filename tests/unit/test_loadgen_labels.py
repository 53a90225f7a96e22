"""fraud-loadgen's label feed (loadgen/labels.py) and fraud recall over time (loadgen/report.py)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from contracts.label import decode_label
from loadgen.labels import LabelFeed
from loadgen.report import ReceivedLog, SentLog, recall_over_time, render_text, summarize
from simulator.transactions import TransactionSimulator


class FakeProducer:
    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes, dict[str, Any]]] = []

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: object) -> None:
        self.produced.append((topic, key, msgspec.json.decode(value)))

    def poll(self, _timeout: float) -> int:
        return 0


def label(index: int, event_time: int, delay_ms: int, fraud: bool = True) -> dict[str, object]:
    return {
        "transaction_id": f"lgx-{index}",
        "card_id": f"card-{index}",
        "terminal_id": "t-1",
        "fraud": fraud,
        "event_time": event_time,
        "reported_at": event_time + delay_ms,
    }


def test_a_label_takes_its_transactions_send_time_and_waits_for_its_delay() -> None:
    producer = FakeProducer()
    sent_ms = [1_000, 1_010]
    feed = LabelFeed(producer, "labels", "lgx", sent_ms)  # type: ignore[arg-type]
    feed.add([label(1, event_time=500, delay_ms=300)])
    feed.send_due(1_309)
    assert producer.produced == [] and feed.pending == 1
    feed.send_due(1_310)
    ((topic, key, value),) = producer.produced
    assert (topic, key) == ("labels", b"card-1")
    assert (value["event_time"], value["reported_at"]) == (1_010, 1_310)
    assert (value["transaction_id"], value["fraud"]) == ("lgx-1", True)
    assert feed.summary() == {
        "labels_topic": "labels",
        "labels_sent": 1,
        "labels_fraud_sent": 1,
        "labels_failed": 0,
        "labels_pending": 0,
    }


def test_a_label_of_a_transaction_not_sent_yet_waits_for_it() -> None:
    producer = FakeProducer()
    sent_ms: list[int] = [1_000]
    feed = LabelFeed(producer, "labels", "lgx", sent_ms)  # type: ignore[arg-type]
    feed.add([label(2, event_time=0, delay_ms=5, fraud=False), label(0, 0, 10)])
    feed.send_due(10_000)
    assert [v["transaction_id"] for _t, _k, v in producer.produced] == ["lgx-0"]
    assert feed.pending == 1
    sent_ms.extend([2_000, 3_000])
    feed.send_due(3_004)
    assert feed.pending == 1
    feed.send_due(3_005)
    assert feed.pending == 0 and feed.sent == 2 and feed.sent_fraud == 1


def test_labels_from_the_simulator_become_valid_label_records() -> None:
    simulator = TransactionSimulator(3, start_time_ms=1_800_000_000_000, id_prefix="lgq")
    producer = FakeProducer()
    sent_ms: list[int] = []
    feed = LabelFeed(producer, "labels", "lgq", sent_ms)  # type: ignore[arg-type]
    for _ in range(20):
        batch = simulator.generate(1_000, rate_per_s=3_000)
        sent_ms.extend(batch.columns.event_time.tolist())
        feed.add(batch.labels)
    feed.send_due(2**62)
    assert feed.sent > 0
    for _topic, key, value in producer.produced:
        decoded = decode_label(msgspec.json.encode(value))
        assert key == decoded.card_id.encode() and decoded.reported_at >= decoded.event_time


def test_recall_over_time_counts_the_fraud_sent_in_each_period() -> None:
    started = 1_000_000
    sent_ms = np.array([started + s * 1000 for s in (0, 1, 5, 12, 13, 25)], np.int64)
    is_fraud = np.array([True, True, False, True, True, False])
    caught = np.array([False, True, True, True, True, False])
    rows = recall_over_time(started, sent_ms, is_fraud, caught, every_s=10)
    assert [(r["from_s"], r["fraud"], r["caught"], r["recall"]) for r in rows] == [
        (0, 2, 1, 0.5),
        (10, 2, 2, 1.0),
        (20, 0, 0, None),
    ]


def four_frauds_summary() -> dict[str, Any]:
    """The summary of four frauds sent 10 s apart: two approved, one declined, one reviewed."""
    sent = SentLog(started_ms=0)
    for i in range(4):
        sent.transaction_ids.append(f"t{i}")
        sent.sent_ms.append(i * 10_000)
        sent.is_fraud.append(True)
        sent.scenario.append("compromised_terminal")
        sent.malformed.append(False)
    decisions = [("t0", "approve"), ("t1", "approve"), ("t2", "decline"), ("t3", "review")]
    received = ReceivedLog(decisions=[(tx, d, i, i + 5) for i, (tx, d) in enumerate(decisions)])
    return summarize(sent, received, 30.0, 31.0)


def test_the_summary_shows_recall_by_time_and_the_labels() -> None:
    summary = four_frauds_summary()
    assert summary["fraud_recall_halves"] == [0.0, 1.0]
    assert summary["recall_by_scenario_halves"] == {"compromised_terminal": [0.0, 1.0]}
    summary.update(labels_topic="labels", labels_sent=7, labels_fraud_sent=5)
    summary.update(labels_failed=0, labels_pending=2, time_scale=27_000.0)
    text = render_text(summary)
    assert "recall by time  halves [0.0, 1.0]; 0-10 s 0.0 (0/1)" in text
    assert "labels sent              7" in text
    assert "27000.0 x real time" in text


def test_recall_over_many_periods_is_one_sparkline() -> None:
    summary = four_frauds_summary()
    summary["recall_over_time"] = [
        {"from_s": 10 * i, "to_s": 10 * i + 10, "fraud": f, "caught": c, "recall": r}
        for i, (f, c, r) in enumerate([(4, 0, 0.0), (0, 0, None), *[(4, 4, 1.0)] * 28])
    ]
    summary["fraud_recall_halves"] = [0.5, 1.0]
    line = next(x for x in render_text(summary).splitlines() if x.startswith("recall by time"))
    assert line == (
        "recall by time  halves [0.5, 1.0]; per 10 s ▁·"
        + "█" * 28
        + " (lowest 0.0, highest 1.0; --report draws it)"
    )


def test_the_false_positive_rate_is_split_by_half_of_the_run_too() -> None:
    sent = SentLog(started_ms=0)
    for i in range(4):
        sent.transaction_ids.append(f"t{i}")
        sent.sent_ms.append(i * 10_000)
        sent.is_fraud.append(False)
        sent.scenario.append("legit")
        sent.malformed.append(False)
    decisions = [("t0", "review"), ("t1", "decline"), ("t2", "approve"), ("t3", "review")]
    received = ReceivedLog(decisions=[(tx, d, i, i + 5) for i, (tx, d) in enumerate(decisions)])
    summary = summarize(sent, received, 30.0, 31.0)
    assert summary["false_positive_rate_halves"] == [1.0, 0.5]
    assert "false-positive rate 0.75, halves [1.0, 0.5]" in render_text(summary)
