"""The service loop with card history on (in-memory consumer, sink and changelog): the state
it holds must equal what its changelog restores, through lost partitions, retried outputs and
aborted transactions (the state review's findings 3, 6 and 8)."""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, Message
from prometheus_client import CollectorRegistry

from contracts.terminal_risk import NUM_TERMINAL_FEATURES
from contracts.transaction import decode_transaction
from scorer.card_history import CardHistory
from scorer.columns import TransactionColumns
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from stream.sink import Output
from tests.support.waiting import wait_until
from tests.unit.fakes import MemoryChangelog
from tests.unit.replica import RECORDS, TOPIC, Replica, messages, record_value, tp


def states(state: OwnedCardHistory, partition: int, cards: set[str]) -> dict[str, bytes | None]:
    return {card: state.current(partition, card).state for card in cards}


def restored(changelog: MemoryChangelog, partitions: list[int]) -> OwnedCardHistory:
    state = OwnedCardHistory(changelog, time_scale=1.0, metrics=ServiceMetrics(CollectorRegistry()))
    state.restore(partitions)
    return state


def expected_states(offsets: range, partition: int = 0) -> dict[str, bytes | None]:
    """Each card's state after the records of `partition` at `offsets`, applied once, in
    order: what an uninterrupted replica holds."""
    transactions = [decode_transaction(record_value(partition, o)) for o in offsets]
    columns = TransactionColumns.from_transactions(transactions)
    history = CardHistory()
    history.update_and_features(
        columns.card_id, columns, columns.merchant_id, np.array(list(offsets), np.int64)
    )
    return {card: history.state_of(card) for card in set(columns.card_id)}


def interleaved(start: int, end: int) -> list[Message]:
    """Records `start`…`end` of partitions 0 and 1, alternating: every batch holds both."""
    pairs = zip(messages(0, range(start, end)), messages(1, range(start, end)), strict=True)
    return [message for pair in pairs for message in pair]


@pytest.mark.parametrize("scoring", ["inline", "thread"])
def test_lost_partitions_never_wipe_the_updates_of_the_partitions_kept(scoring: str) -> None:
    # Finding 6: in thread mode `lost` did not wait for the batch being scored, and dropping the
    # lost partition's state made that batch's whole history update vanish, the kept
    # partition's records included. The first mixed batch waits inside its update until the
    # partition is lost (at most 3 s: the consuming thread may itself wait a second for room in
    # the hand-off, and a replica that waits for the batch waits that long); then rounds of
    # assign and lose with a tiny switch interval, as the revoke race test does.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with Replica(
            card_history=True, scoring=scoring, max_batch_size=8, handoff_batches=4
        ) as replica:
            state = replica.card_history
            assert state is not None
            update, let_go = state.update, state.let_go
            in_update, dropped = threading.Event(), threading.Event()

            def gated_update(records: Any, columns: Any) -> Any:
                if {r.position[0][1] for r in records} == {0, 1} and not in_update.is_set():
                    in_update.set()
                    dropped.wait(3.0)
                return update(records, columns)

            def noted_let_go(partitions: Any, ends: Any = None) -> list[int]:
                gone = let_go(partitions, ends)
                dropped.set()
                return gone

            state.update = gated_update  # type: ignore[method-assign]
            state.let_go = noted_let_go  # type: ignore[method-assign]
            replica.consumer.assign(tp(0, 1))
            replica.consumer.feed(interleaved(0, 50))
            wait_until(in_update.is_set)
            replica.consumer.lose(tp(1))
            for round_ in range(1, 20):
                replica.consumer.assign(tp(1))
                replica.consumer.feed(interleaved(round_ * 50, round_ * 50 + 50))
                time.sleep(0.002)
                replica.consumer.lose(tp(1))
            wait_until(lambda: replica.consumer.stored.get((TOPIC, 0)) == 1_000, timeout_s=60)
            held = states(state, 0, set(expected := expected_states(range(1_000))))
    finally:
        sys.setswitchinterval(interval)
    assert replica.service.failure is None
    assert held == expected
    assert states(restored(replica.changelog, [0]), 0, set(expected)) == expected


def test_a_card_state_sent_again_is_the_cards_newest() -> None:
    # Finding 3: a failed card state was retried as it was, after a newer state of the same
    # card had been delivered; compaction then keeps the older one, and a restore rolls the
    # card back. Here one card state fails once while the batches after it are delivered.
    # The card with the most transactions among the first records of partition 0.
    counts = Counter(str(RECORDS[o]["card_id"]) for o in range(1_000))
    card = counts.most_common(1)[0][0]
    with Replica(card_history=True, max_batch_size=4) as replica:
        failed: list[Output] = []

        def fail_first(output: Output) -> bool:
            first = output.kind == "changelog" and output.key == card.encode() and not failed
            if first:
                failed.append(output)
            return first

        replica.sink.fail_when = fail_first
        replica.consumer.assign(tp(0))
        same_card = [o for o in range(1_000) if RECORDS[o]["card_id"] == card]
        assert len(same_card) >= 6
        end = same_card[5] + 1
        replica.consumer.feed(messages(0, range(end)))
        wait_until(lambda: replica.consumer.stored.get((TOPIC, 0)) == end)
        assert replica.card_history is not None
        held = replica.card_history.current(0, card).state
    assert failed, "the first state of the card failed once"
    written = [state for key, state in replica.changelog.partitions[0] if key == card]
    assert written[-1] == held, "the card's last changelog record is its newest state"
    replica.changelog.compact()
    assert restored(replica.changelog, [0]).current(0, card).state == held


def test_a_revoked_partition_is_let_go_at_once_and_its_cards_forgotten_off_the_loop() -> None:
    with Replica(card_history=True, state_retain_s=0.0) as replica:
        state = replica.card_history
        assert state is not None
        forgotten_on: list[str] = []
        forget_cards = state.forget_cards

        def noted(partitions: Any) -> None:
            forgotten_on.append(threading.current_thread().name)
            forget_cards(partitions)

        state.forget_cards = noted  # type: ignore[method-assign]
        replica.consumer.assign(tp(0, 1))
        wait_until(lambda: state.owned() == [0, 1])
        replica.consumer.feed(interleaved(0, 100))
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 100, (TOPIC, 1): 100})
        cards = {p: set(expected_states(range(100), p)) for p in (0, 1)}
        replica.consumer.revoke(tp(1))
        wait_until(lambda: state.owned() == [0])
        wait_until(lambda: forgotten_on == ["card-state-restore"], what="cards forgotten")
        held = replica.metrics.registry.get_sample_value("fraud_card_state_cards")
        assert held == len(cards[0]), "only the kept partition's cards are held"
        assert not any(state.current(1, card).owned for card in cards[1])
        assert states(state, 0, cards[0]) == expected_states(range(100), 0)


def owning_two_partitions(replica: Replica, decided: int) -> OwnedCardHistory:
    """The replica's card state once it owns partitions 0 and 1 and has decided their first
    `decided` records each."""
    state = replica.card_history
    assert state is not None
    replica.consumer.assign(tp(0, 1))
    wait_until(lambda: state.owned() == [0, 1])
    replica.consumer.feed(interleaved(0, decided))
    wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): decided, (TOPIC, 1): decided})
    return state


def test_a_partition_revoked_with_its_states_delivered_keeps_its_cards_for_its_return() -> None:
    with Replica(card_history=True) as replica:
        state = owning_two_partitions(replica, 100)
        gauge = replica.metrics.registry.get_sample_value
        held = gauge("fraud_card_state_cards")
        replica.consumer.revoke(tp(1))
        wait_until(lambda: state.owned() == [0])
        end = replica.changelog.end(1)
        assert end > 0 and gauge("fraud_card_state_cards") == held, "its cards kept"
        assert gauge("fraud_state_kept_partitions") == 1

        replica.consumer.assign(tp(1))
        wait_until(lambda: state.owned() == [0, 1])

        assert replica.changelog.reads[-1] == (1, end), "only what was written since"
        assert gauge("fraud_state_kept_partitions") == 0
        assert gauge("fraud_state_restore_seconds_count", {"read": "tail"}) == 1
        cards = set(expected_states(range(100), 1))
        assert states(state, 1, cards) == expected_states(range(100), 1)
    # Stopping revokes every partition: nothing will come back to a replica that stops.
    assert gauge("fraud_state_kept_partitions") == 0


def test_a_replica_warmed_up_joins_then_reads_only_the_tail_of_what_it_is_given() -> None:
    replica = Replica(card_history=True, state_warm_up="on")
    changelog = replica.changelog
    for partition in (0, 1):
        for card, state_record in expected_states(range(40), partition).items():
            changelog.append(partition, card, state_record)
    with replica:
        state = replica.card_history
        assert state is not None
        wait_until(lambda: changelog.reads[:2] == [(0, 0), (1, 0)], what="the warm-up")
        end = changelog.end(1)
        replica.consumer.assign(tp(1))
        wait_until(lambda: state.owned() == [1])
        assert changelog.reads[2:] == [(1, end)], "only the tail of the partition given"
        replica.consumer.feed(messages(1, range(40, 60)))
        wait_until(lambda: replica.progress().get((TOPIC, 1)) == 60)
        cards = set(expected_states(range(60), 1))
        assert states(state, 1, cards) == expected_states(range(60), 1)


def test_a_warm_up_that_fails_leaves_the_replica_to_join_cold() -> None:
    replica = Replica(card_history=True, state_warm_up="on")

    def unlisted() -> list[int]:
        raise RuntimeError("changelog cards-changelog cannot be listed")

    replica.changelog.partition_ids = unlisted  # type: ignore[method-assign]
    with replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(20)))
        wait_until(lambda: replica.progress().get((TOPIC, 0)) == 20)
        assert replica.changelog.reads[-1] == (0, 0), "restored whole"
    assert replica.service.failure is None


def test_a_partition_revoked_with_a_card_state_undelivered_forgets_its_cards() -> None:
    # Its kept cards would hold a state the changelog lacks: a return must read it all.
    with Replica(card_history=True) as replica:
        state = owning_two_partitions(replica, 50)
        gauge = replica.metrics.registry.get_sample_value
        replica.sink.fail_when = lambda output: output.kind == "changelog" and output.partition == 1
        replica.consumer.feed(interleaved(50, 100))
        wait_until(lambda: replica.redelivery.busy, what="a card state not delivered")
        replica.consumer.revoke(tp(1))
        wait_until(lambda: state.owned() == [0])
        kept = len(expected_states(range(100), 0))
        wait_until(lambda: gauge("fraud_card_state_cards") == kept, what="its cards forgotten")
        assert gauge("fraud_state_kept_partitions") == 0

        replica.sink.fail_when = None
        replica.consumer.assign(tp(1))
        wait_until(lambda: state.owned() == [0, 1])
        assert replica.changelog.reads[-1] == (1, 0), "its whole changelog"


@pytest.mark.parametrize("commit_fails", ["aborted", "retried"])
def test_a_revoke_whose_transaction_does_not_commit_keeps_no_cards(commit_fails: str) -> None:
    # Exactly-once: the revoke's commit aborted (or failed and was retried, then aborted), yet
    # the cards were kept with the aborted updates; the return read only the changelog's tail,
    # and the kept cards, newer by input offset, stayed unlike the changelog for good. After
    # the abort nothing rewound the partition kept either: it never committed again.
    with Replica(card_history=True, processing_guarantee="exactly-once", transaction_ms=1.0) as r:
        state = r.card_history
        assert state is not None
        r.consumer.assign(tp(0, 1))
        wait_until(lambda: state.owned() == [0, 1])
        r.consumer.feed(interleaved(0, 50))
        wait_until(lambda: r.committed() == {(TOPIC, 0): 50, (TOPIC, 1): 50})
        r.transactions._commit_interval_s = 3600.0  # type: ignore[union-attr]
        r.consumer.feed(interleaved(50, 100))
        cards = set(expected_states(range(100), 1))
        wait_until(
            lambda: states(state, 1, cards) == expected_states(range(100), 1),
            what="records 50 to 99 applied in the open transaction",
        )
        if commit_fails == "aborted":
            r.producer.fail_next_commit = KafkaError(
                KafkaError._STATE, "transaction failed", txn_requires_abort=True
            )
        else:
            r.producer.commit_error = KafkaError(KafkaError._TIMED_OUT, "timeout", retriable=True)
        r.consumer.revoke(tp(1))
        wait_until(lambda: state.owned() == [0])
        gauge = r.metrics.registry.get_sample_value
        assert gauge("fraud_state_kept_partitions") == 0
        if commit_fails == "retried":
            r.producer.commit_error = KafkaError(
                KafkaError._STATE, "fenced", txn_requires_abort=True
            )
            wait_until(lambda: r.consumer.seeks, what="the abort's rewind")
            r.producer.commit_error = None
        r.transactions._commit_interval_s = 0.001  # type: ignore[union-attr]
        r.consumer.feed(messages(0, range(100, 150)))
        wait_until(
            lambda: r.committed().get((TOPIC, 0), 0) == 150, what="the partition kept commits"
        )

        r.consumer.assign(tp(1))
        wait_until(lambda: state.owned() == [0, 1])
        assert r.changelog.reads[-1] == (1, 0), "its whole changelog"
        assert states(state, 1, cards) == states(restored(r.changelog, [1]), 1, cards)


def test_an_aborted_transaction_undoes_its_card_states_in_memory() -> None:
    # Finding 8: every abort reloaded the whole card state from the changelog.
    with Replica(
        card_history=True, processing_guarantee="exactly-once", transaction_ms=1.0
    ) as replica:
        replica.consumer.assign(tp(0, 1))
        replica.consumer.feed(messages(0, range(200)) + messages(1, range(200)))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 200, (TOPIC, 1): 200})
        reads: list[int] = []
        read = replica.changelog.read

        def counted(
            partition: int, progress: Callable[[], None], start: int = 0
        ) -> Iterator[list[tuple[str, bytes | None]]]:
            reads.append(partition)
            return read(partition, progress, start)

        replica.changelog.read = counted  # type: ignore[method-assign]
        replica.producer.fail_next_commit = KafkaError(
            KafkaError._STATE, "transaction failed", txn_requires_abort=True
        )
        replica.consumer.feed(messages(0, range(200, 400)) + messages(1, range(200, 400)))
        wait_until(lambda: replica.committed() == {(TOPIC, 0): 400, (TOPIC, 1): 400})
        assert replica.card_history is not None
        expected = {p: expected_states(range(400), p) for p in (0, 1)}
        held = {p: states(replica.card_history, p, set(expected[p])) for p in (0, 1)}
    assert replica.consumer.seeks, "the transaction aborted and the consumer went back"
    assert reads == [], "no changelog was read again"
    assert held == expected
    for p in (0, 1):
        assert states(restored(replica.changelog, [p]), p, set(expected[p])) == expected[p]
    undone = replica.metrics.registry.get_sample_value(
        "fraud_state_rollbacks_total", {"method": "undo"}
    )
    assert undone == 1


class Terminals:
    """A copy of terminal-risk that is loaded when the test says."""

    def __init__(self) -> None:
        self.loaded = threading.Event()
        #: Why its topic cannot be read (None: it can).
        self.problem: str | None = None
        #: Why its reader's thread ended (None: it runs).
        self.stopped_by: str | None = None

    def start(self) -> None:
        pass

    def stopped(self) -> str | None:
        return self.stopped_by

    def close(self) -> None:
        pass

    def __len__(self) -> int:
        return 0

    def features(self, terminal_ids: list[str | None], event_time: np.ndarray) -> np.ndarray:
        return np.zeros((len(terminal_ids), NUM_TERMINAL_FEATURES), np.float32)


def test_a_replica_consumes_only_once_terminal_risk_is_loaded() -> None:
    # Finding 9: after a restart the scorer scored with neutral terminal risk until it had read
    # terminal-risk again, and /readyz said ready meanwhile.
    terminals = Terminals()
    with Replica(terminals=terminals) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(20)))
        wait_until(lambda: replica.health.ready() == (False, "loading terminal-risk"))
        time.sleep(0.2)  # a replica that did not wait would poll meanwhile
        assert replica.consumer.polls == 0, "nothing consumed"
        assert replica.health.alive()[0]
        terminals.loaded.set()
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 20})
        wait_until(lambda: replica.health.ready()[0])


def test_a_replica_never_consumes_without_terminal_risk_however_long_it_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Issue 43, finding 2: this test once asserted the opposite (past the load timeout the
    # replica consumed anyway, scoring with neutral terminal risk). A control topic fails
    # closed: not ready and nothing consumed until it is read; the timeout only logs an error.
    terminals = Terminals()
    terminals.problem = "TOPIC_AUTHORIZATION_FAILED: Topic authorization failed"
    with Replica(terminals=terminals, terminal_risk_load_timeout_s=0.2) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(20)))
        wait_until(lambda: "not read to its end within 0.2s" in caplog.text)
        time.sleep(0.3)
        assert replica.consumer.polls == 0, "nothing consumed"
        assert replica.health.ready() == (
            False,
            "loading terminal-risk: TOPIC_AUTHORIZATION_FAILED: Topic authorization failed",
        )
        assert replica.health.alive()[0]
        assert caplog.text.count("not read to its end") == 1, "said once"
        terminals.problem = None
        terminals.loaded.set()
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 20})
        wait_until(lambda: replica.health.ready()[0])


def test_a_replica_whose_control_topic_reader_stopped_is_not_alive() -> None:
    # The review of issue 43: a reader's thread that ended (a BaseException) was silent; the
    # replica went on deciding with a table that no longer followed its topic, /healthz 200.
    terminals = Terminals()
    terminals.loaded.set()
    with Replica(terminals=terminals) as replica:
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(20)))
        wait_until(lambda: replica.consumer.stored == {(TOPIC, 0): 20})
        assert replica.health.alive() == (True, "ok")
        terminals.stopped_by = "MemoryError: out of it"
        why = (
            "the reader of terminal-risk stopped (MemoryError: out of it): nothing more of it "
            "is read"
        )
        assert replica.health.alive() == (False, why)
        assert replica.health.ready() == (False, why)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_partition_restoring_its_state_never_stops_the_partitions_kept(guarantee: str) -> None:
    # Issue 26: the replica restored a new partition's card state inside the assignment
    # callback, and scored nothing meanwhile (about 9 s per million cards). Partition 1's
    # restore now waits on a gate while partition 0 goes on; partition 1 is scored once it
    # opens, with the history its changelog held.
    with Replica(card_history=True, processing_guarantee=guarantee, max_batch_size=8) as replica:
        state, gauge = replica.card_history, replica.metrics.registry.get_sample_value
        assert state is not None
        changelog_read, gate = replica.changelog.read, threading.Event()

        def gated_read(partition: int, progress: Any, start: int = 0) -> Any:
            while partition == 1 and not gate.wait(0.001):
                progress()
            yield from changelog_read(partition, progress, start)

        replica.changelog.read = gated_read  # type: ignore[method-assign]
        held = expected_states(range(20), partition=1)
        for card, state_record in held.items():
            replica.changelog.append(1, card, state_record)
        replica.consumer.assign(tp(0))
        replica.consumer.feed(messages(0, range(50)))
        wait_until(lambda: replica.progress().get((TOPIC, 0)) == 50)
        replica.consumer.assign(tp(1))
        replica.consumer.feed(messages(1, range(20, 40)) + messages(0, range(50, 100)))
        wait_until(lambda: replica.progress().get((TOPIC, 0)) == 100, what="partition 0 scored")
        assert (TOPIC, 1) not in replica.progress(), "partition 1 waits for its state"
        assert gauge("fraud_state_restoring_partitions") == 1
        gate.set()
        wait_until(lambda: replica.progress().get((TOPIC, 1)) == 40, what="partition 1 scored")
        assert gauge("fraud_state_restoring_partitions") == 0
        assert gauge("fraud_state_restore_seconds_count", {"read": "whole"}) == 2
        assert gauge("fraud_state_restore_changelog_records_total", {"read": "whole"}) == 20
        expected = expected_states(range(40), partition=1)
        assert states(state, 1, set(expected)) == expected, "scored on its restored history"
    assert replica.service.failure is None
