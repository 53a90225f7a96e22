"""The service loop with an in-memory consumer, sink and scorer: assignment, backpressure,
revoke, lost partitions and shutdown, driven deterministically from the test."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from plumbing.errors import TransientDeliveryError
from tests.support.waiting import wait_until
from tests.unit.fakes import FakeScorer
from tests.unit.replica import (
    RECORDS,
    TOPIC,
    Replica,
    messages,
    record_value,
    tp,
)

MODES = pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])


@pytest.fixture(autouse=True, params=["inline", "thread"])
def scoring(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with batches scored on the consuming thread and on the scoring thread."""
    monkeypatch.setattr(Replica, "scoring", request.param)
    return str(request.param)


@MODES
def test_every_record_is_decided_and_committed_after_its_outputs_are_durable(mode: str) -> None:
    with Replica(processing_guarantee=mode) as replica:
        replica.consumer.assign(tp(0, 1))
        replica.consumer.feed(messages(0, range(100)) + messages(1, range(50)))
        wait_until(lambda: replica.progress() == {(TOPIC, 0): 100, (TOPIC, 1): 50})
        assert len(replica.decided()) == 150
    assert replica.committed() == {(TOPIC, 0): 100, (TOPIC, 1): 50}
    assert replica.consumer.closed


@MODES
def test_invalid_records_are_dead_lettered_in_line_with_the_decisions(mode: str) -> None:
    def value_of(offset: int) -> bytes:
        return b"{broken" if offset == 3 else msgspec.json.encode(RECORDS[offset])

    with Replica(processing_guarantee=mode) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(10), value_of))
        wait_until(lambda: replica.progress() == {(TOPIC, 0): 10})
    topics = [topic for topic, _ in replica.outputs()]
    assert topics.count(replica.config.dlq_topic) == 1 and len(replica.decided()) == 9


def test_at_the_in_flight_bound_partitions_pause_and_the_consumer_keeps_polling() -> None:
    with Replica(max_in_flight_records=64, max_batch_size=16) as replica:
        replica.sink.holding = True  # the broker acknowledges nothing for now
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(500)))
        wait_until(lambda: replica.consumer.paused == {(TOPIC, 0)})
        polls = replica.consumer.polls
        wait_until(lambda: replica.consumer.polls > polls + 20)
        assert replica.parts.tracker.in_flight <= 64, "never past the bound"
        replica.sink.holding = False
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 500})
        assert not replica.consumer.paused


def test_while_outputs_are_retried_partitions_pause_and_the_consumer_keeps_polling() -> None:
    # Finding 3 of the review: a retry round lasts attempts x message.timeout.ms; the consumer
    # must keep serving the group meanwhile (max.poll.interval.ms), not wait for room.
    with Replica(delivery_attempts=1_000, handoff_batches=1, max_batch_size=4) as replica:
        replica.sink.failing = TransientDeliveryError("broker down", "_TRANSPORT")
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(200)))
        wait_until(lambda: replica.consumer.paused == {(TOPIC, 0)})
        polls = replica.consumer.polls
        wait_until(lambda: replica.consumer.polls > polls + 50)
        assert replica.consumer.stored == {}, "nothing is committed while outputs fail"
        replica.sink.failing = None
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 200}, timeout_s=30)
        assert len(replica.decided()) == 200


def test_a_stuck_model_call_pauses_partitions_on_the_thread_and_stops_the_loop_inline(
    scoring: str,
) -> None:
    stuck, release = threading.Event(), threading.Event()

    class StuckScorer(FakeScorer):
        def score(self, features: np.ndarray) -> np.ndarray:
            if len(features) > 1:  # not the warm-up's canary
                stuck.set()
                release.wait(30)
            return super().score(features)

    with Replica(StuckScorer(), handoff_batches=1, max_batch_size=8) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(100)))
        if scoring == "thread":  # the consumer keeps the group while the thread is stuck
            wait_until(lambda: replica.consumer.paused == {(TOPIC, 0)}, timeout_s=10)
            polls = replica.consumer.polls
            wait_until(lambda: replica.consumer.polls > polls + 20)
        else:  # the loop itself waits: no pass, so no heartbeat, and /healthz says so in time
            wait_until(stuck.is_set)
            polls = replica.consumer.polls
            time.sleep(0.3)
            assert replica.consumer.polls == polls
        release.set()
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 100})


def test_batches_are_scored_on_the_thread_the_setting_names(scoring: str) -> None:
    threads: set[str] = set()

    class WhereScorer(FakeScorer):
        def score(self, features: np.ndarray) -> np.ndarray:
            threads.add(threading.current_thread().name)
            return super().score(features)

    with Replica(WhereScorer(), max_batch_size=8) as replica:
        replica.thread.name = "consuming"
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(40)))
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 40})
    assert threads == {"consuming" if scoring == "inline" else "scoring"}


@MODES
def test_a_revoke_releases_undecided_records_and_commits_what_was_decided(mode: str) -> None:
    # Long transactions: only the revoke can commit partition 1 in exactly-once mode.
    with Replica(processing_guarantee=mode, transaction_ms=60_000) as replica:
        replica.consumer.assign(tp(0, 1))
        replica.consumer.feed(messages(0, range(40)) + messages(1, range(40)))
        wait_until(
            lambda: replica.parts.tracker.in_flight == 0 and len(replica.consumer.handed_out) == 80
        )
        replica.consumer.revoke(tp(1))
        replica.consumer.feed(messages(0, range(40, 60)) + messages(1, range(40, 60)))
        wait_until(lambda: replica.committed().get((TOPIC, 1)) == 40)
        wait_until(lambda: len(replica.consumer.handed_out) == 100)
        assert replica.parts.tracker.pending_in([(TOPIC, 1)]) == 0
    assert replica.committed() == {(TOPIC, 0): 60, (TOPIC, 1): 40}, "nothing after the revoke"


def test_lost_partitions_are_forgotten_without_a_commit() -> None:
    with Replica() as replica:
        replica.sink.holding = True
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(30)))
        wait_until(lambda: replica.parts.tracker.in_flight == 30)
        replica.consumer.lose(tp(0))
        wait_until(lambda: replica.parts.tracker.in_flight == 0)
        replica.sink.holding = False
        time.sleep(0.05)
    assert (TOPIC, 0) not in replica.consumer.consumer_commits


@contextmanager
def captured(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="stream.service"):
        yield caplog


def test_shutdown_has_one_deadline_and_reports_what_stays_uncommitted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Finding 4 of the review: close() runs the revoke callback, which used to start a fresh
    # full timeout; and the final line always said 0.
    with captured(caplog), Replica(shutdown_timeout_s=1.5) as replica:
        replica.sink.holding = True  # nothing is ever acknowledged
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(25)))
        wait_until(lambda: replica.parts.tracker.in_flight == 25)
        took_s = replica.stop()
    assert took_s < 2.5, f"shutdown took {took_s:.1f}s for a 1.5s grace period"
    assert "stopped; records left uncommitted: 25" in caplog.text


def test_revokes_never_pair_scores_with_the_wrong_records() -> None:
    # Finding 5 of the review: a revoke edited batches the scoring thread could hold. With a
    # tiny switch interval, any such race shows as a decision whose score is not its own.
    def expected_score(record: dict[str, object]) -> float:
        amount = float(record["amount"])  # type: ignore[arg-type]
        x = np.float32(np.log1p(amount))
        return float(x / (np.float32(1.0) + x))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with Replica(max_batch_size=8, handoff_batches=4) as replica:
            for round_ in range(20):
                replica.consumer.assign(tp(0, 1))
                start = round_ * 50
                replica.consumer.feed(
                    messages(0, range(start, start + 50)) + messages(1, range(start, start + 50))
                )
                time.sleep(0.002)
                replica.consumer.revoke(tp(1))
            wait_until(lambda: replica.consumer.stored.get((TOPIC, 0)) == 1_000, timeout_s=60)
    finally:
        sys.setswitchinterval(interval)
    assert replica.service.failure is None
    by_id = {r["transaction_id"]: r for r in RECORDS}
    for transaction_id, decision in replica.decided().items():
        assert decision["score"] == pytest.approx(expected_score(by_id[transaction_id]))


def test_an_aborted_transaction_is_decided_again_and_nothing_becomes_durable_twice() -> None:
    with Replica(processing_guarantee="exactly-once", transaction_ms=1.0) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(50)))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 50})
        replica.producer.fail_next_commit = KafkaError(
            KafkaError._STATE, "transaction failed", txn_requires_abort=True
        )
        replica.consumer.feed(messages(0, range(50, 120)))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 120})
    assert replica.consumer.seeks, "the consumer went back to the committed offset"
    assert len(replica.decided()) == 120


def test_exactly_once_is_unready_while_a_commit_is_not_confirmed() -> None:
    # Found by the fault suite (broker killed): commits timed out for the whole outage and
    # fetching stopped, but /readyz stayed 200, so nothing outside knew the replica was stuck.
    with Replica(processing_guarantee="exactly-once", transaction_ms=1.0) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(50)))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 50})
        wait_until(lambda: replica.health.ready()[0])
        replica.producer.commit_error = KafkaError(
            KafkaError._TIMED_OUT, "coordinator unreachable", retriable=True
        )
        replica.consumer.feed(messages(0, range(50, 100)))
        wait_until(lambda: not replica.health.ready()[0])
        assert replica.health.ready()[1] == "outputs cannot be delivered; fetching stopped"
        wait_until(lambda: replica.consumer.paused == {(TOPIC, 0)})
        replica.producer.commit_error = None
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 100})
        wait_until(lambda: replica.health.ready()[0])
    assert len(replica.decided()) == 100


def test_after_the_cluster_went_away_a_new_producer_takes_over_and_nothing_is_durable_twice():
    # Found by the fault suite (broker killed, exactly-once): after the restart librdkafka
    # blocked in send_offsets_to_transaction() past its timeout, on the group coordinator it had
    # cached, until the replica was restarted. Now the producer is replaced in the process.
    with Replica(processing_guarantee="exactly-once", transaction_ms=1.0) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(50)))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 50})
        old = replica.producer
        old.commit_error = KafkaError(KafkaError._TRANSPORT, "broker down", retriable=True)
        replica.consumer.feed(messages(0, range(50, 100)))
        wait_until(lambda: not replica.health.ready()[0])
        unregistered = KafkaError(KafkaError._TIMED_OUT, "coordinator not found", retriable=True)
        replica.replacement_init_error = unregistered
        assert replica.transactions is not None, "the exactly-once replica has a transactional sink"
        replica.transactions.cluster_lost()  # what the clients' error callback does
        wait_until(lambda: len(replica.producers) == 2)
        replica.transactions.cluster_lost()  # still down: the replacement covers this too
        polls = replica.consumer.polls
        wait_until(lambda: replica.consumer.polls > polls + 20)
        assert not replica.health.ready()[0], "not ready while the new producer is unregistered"
        assert replica.service.failure is None and replica.committed() == {(TOPIC, 0): 50}
        replica.producer.init_error = None
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 100})
        wait_until(lambda: replica.health.ready()[0])
    assert replica.service.failure is None and replica.producer.initialized
    assert len(replica.producers) == 2, "one replacement for one outage"
    replaced = replica.metrics.registry.get_sample_value("fraud_producer_replacements_total")
    assert replaced == 1
    assert len(old.committed) == 50, "the old producer's open transaction never committed"
    assert replica.consumer.seeks, "the consumer went back to the committed offset"
    assert len(replica.decided()) == 100


def a_commit_aborts_and_the_abort_fails(replica: Replica, abort_error: KafkaError) -> None:
    """Records 0-49 of partition 0 committed; the transaction of 50-119 fails and must be
    aborted, and abort_transaction() raises `abort_error`."""
    replica.consumer.assign(tp(0))
    replica.consumer.feed(messages(0, range(50)))
    wait_until(lambda: replica.committed() == {(TOPIC, 0): 50})
    replica.producer.abort_error = abort_error
    replica.producer.fail_next_commit = KafkaError(
        KafkaError._STATE, "transaction failed", txn_requires_abort=True
    )
    replica.consumer.feed(messages(0, range(50, 120)))


def test_an_abort_that_times_out_is_tried_again_before_the_next_transaction() -> None:
    # Found by the fault suite (broker killed, exactly-once): abort_transaction() timed out
    # ("retry call to resume"), the service took the abort for done, the next
    # begin_transaction() failed with _CONFLICT and the scoring thread died in both replicas.
    with Replica(processing_guarantee="exactly-once", transaction_ms=1.0) as replica:
        a_commit_aborts_and_the_abort_fails(
            replica,
            KafkaError(KafkaError._TIMED_OUT, "Timed out, retry call to resume", retriable=True),
        )
        wait_until(lambda: not replica.health.ready()[0])
        polls = replica.consumer.polls
        wait_until(lambda: replica.consumer.polls > polls + 20)
        assert replica.service.failure is None and replica.committed() == {(TOPIC, 0): 50}
        replica.producer.abort_error = None
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 120})
        wait_until(lambda: replica.health.ready()[0])
    assert replica.service.failure is None
    assert len(replica.producer.committed) == len(replica.decided()) == 120


def test_an_abort_refused_for_good_stops_the_replica_saying_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Found by the fault suite (broker killed, exactly-once): the abort after a lost session
    # was fenced; the replica stopped as it must, but without the line that tells such an
    # exit from a crash (the commit's fatal error had it, the abort's did not).
    replica = Replica(processing_guarantee="exactly-once", transaction_ms=1.0)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            replica.service.run()
        except KafkaException as exc:  # what `fraud-scorer run` exits 1 on
            raised.append(exc)

    replica.thread = threading.Thread(target=run, daemon=True)
    with replica:
        a_commit_aborts_and_the_abort_fails(
            replica, KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
        )
        wait_until(lambda: bool(raised), what="the replica stopped")
    assert "fatal transaction error" in caplog.text


def test_an_abort_refused_as_invalid_state_replaces_the_producer_instead_of_stopping() -> None:
    # Seen in CI against a real broker (librdkafka #4849): an abort soon after produce() was
    # refused as INVALID_TXN_STATE, fatal for that producer though no replica took over.
    with Replica(processing_guarantee="exactly-once", transaction_ms=1.0) as replica:
        old = replica.producer
        a_commit_aborts_and_the_abort_fails(
            replica,
            KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True),
        )
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 120})
    assert replica.service.failure is None
    assert len(replica.producers) == 2 and replica.producer is not old
    replaced = replica.metrics.registry.get_sample_value("fraud_producer_replacements_total")
    assert replaced == 1
    assert len(old.committed) == 50, "the refused transaction never committed"
    assert len(replica.decided()) == 120


def test_exactly_once_lag_counts_from_what_the_transactions_committed() -> None:
    with Replica(processing_guarantee="exactly-once", transaction_ms=1.0) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(50)))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 50})
        # What librdkafka reports: the committed offset it fetched when the partition came.
        stale = {"fetch_state": "active", "committed_offset": 0, "ls_offset": 50}
        partitions = {"0": {**stale, "consumer_lag": 50}}
        replica.parts.lag.on_statistics(json.dumps({"topics": {TOPIC: {"partitions": partitions}}}))
        assert replica.parts.lag.total == 0


def test_outputs_refused_by_a_failed_transaction_abort_it_instead_of_killing_the_replica() -> None:
    # Found by the fault suite (dead-letter topic deleted, exactly-once): librdkafka failed the
    # open transaction in the background ("Failed to add partition(s) to transaction: Unknown
    # topic or partition"), the next produce() raised _STATE ("Erroneous state") on the
    # scoring thread, which died, and the replica exited with 1.
    with Replica(processing_guarantee="exactly-once", transaction_ms=1.0) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(50)))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 50})
        replica.producer.produce_error = KafkaError(
            KafkaError._STATE, "Unable to produce message: Local: Erroneous state"
        )
        replica.consumer.feed(messages(0, range(50, 120)))
        wait_until(lambda: bool(replica.consumer.seeks))
        replica.producer.produce_error = None
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 120})
    assert replica.service.failure is None
    assert len(replica.producer.committed) == len(replica.decided()) == 120


def test_no_transaction_commits_an_outcome_past_the_offsets_it_commits() -> None:
    # Found by the fault suite (zombie, rebalance storm; exactly-once): the consuming thread
    # dead-letters a bad record at once, while the batch of the records before it is still
    # being scored. A commit then carried that dead letter with offsets short of its record;
    # the partition's next owner read the record again and a second dead letter became visible.
    def slow(features: np.ndarray) -> np.ndarray:
        time.sleep(0.02)
        return (features[:, 0] / (1.0 + features[:, 0])).astype(np.float32)

    bad = {20, 45, 46, 90}

    def value_of(offset: int) -> bytes:
        return b"not json" if offset in bad else record_value(0, offset)

    offset_of = {RECORDS[o % len(RECORDS)]["transaction_id"]: o for o in range(120)}
    with Replica(
        FakeScorer(rule=slow), processing_guarantee="exactly-once", transaction_ms=1.0
    ) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(120), value_of))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 120})
    assert len(replica.producer.transactions) > 1
    letters = []
    for outputs, committed in replica.producer.transactions:
        for topic, value, headers in outputs:
            if topic == replica.config.output_topic:
                assert value is not None, "a decision always has a value"
                source = offset_of[msgspec.json.decode(value)["transaction_id"]]
            else:
                source = int(dict(headers)["dlq.original.offset"])
                letters.append(source)
            assert source < committed[TOPIC, 0], f"offset {source} committed past its offsets"
    assert sorted(letters) == sorted(bad)
    assert len(replica.decided()) == 120 - len(bad)
