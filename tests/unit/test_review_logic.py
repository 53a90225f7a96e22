"""The review console's pure logic: the join window's bound and restart offsets, the
failed-login throttle, and a reason's words from a decision (or a stored case) of release 0.1.0."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from review.auth import FAILURE_WINDOW_S, MAX_FAILURES, Throttle, Throttled, client_key
from review.cases import CaseStore, NewCase, TransactionDetails, case_reason
from review.ingest import (
    TIMELINE_LENGTH,
    CardTimelines,
    RecentTransactions,
    _Decision,
    _decode_decision,
)

DETAILS = TransactionDetails(1.0, "EUR", "m", None, "FR", "pos", None)


@given(
    capacity=st.integers(1, 20),
    reads=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30)), max_size=200),
)
def test_the_window_holds_the_last_reads_and_a_restart_from_its_offsets_holds_them_again(
    capacity, reads
) -> None:
    window = RecentTransactions(capacity)
    offsets = {0: 0, 1: 0, 2: 0}
    log: list[tuple[int, int, str]] = []  # what each partition holds, in order: the topic
    for partition, tid in reads:
        record = (partition, offsets[partition], f"t{tid}")
        offsets[partition] += 1
        log.append(record)
        window.add(*record, DETAILS)
    assert len(window) <= capacity
    # What a replay from the committed offsets reads, partition by partition, in the order a
    # consumer may interleave them (here: all of each partition in turn) holds every id the
    # window holds now.
    restart = window.restart_offsets()
    replayed = RecentTransactions(capacity * 4 + 1)
    for partition, offset, tid in log:
        if partition in restart and offset >= restart[partition]:
            replayed.add(partition, offset, tid, DETAILS)
    held = {tid for _, _, tid in log if window.get(tid) is not None}
    assert all(replayed.get(tid) is not None for tid in held)
    # Without duplicates, a restart reads at most the window's capacity again, per partition.
    if len({tid for _, tid in reads}) == len(reads):
        for partition, start in restart.items():
            assert offsets[partition] - start <= capacity


def test_a_revoked_partition_leaves_the_window() -> None:
    window = RecentTransactions(10)
    window.add(0, 5, "a", DETAILS)
    window.add(1, 7, "b", DETAILS)
    window.forget_partitions({0})
    assert window.get("a") is None and window.get("b") is not None
    assert window.restart_offsets() == {1: 7}


def test_failures_past_the_limit_are_refused_until_the_window_passes() -> None:
    now = [1_000.0]
    throttle = Throttle(clock=lambda: now[0])
    for _ in range(MAX_FAILURES):
        throttle.begin("name:ana", "address:1.2.3.4")  # each a failure: none succeeded
    with pytest.raises(Throttled) as refused:
        throttle.begin("name:ana", "address:9.9.9.9")
    assert refused.value.retry_after_s == FAILURE_WINDOW_S
    # The address is throttled too, for any name; another address and name are not.
    with pytest.raises(Throttled):
        throttle.begin("name:bob", "address:1.2.3.4")
    throttle.begin("name:bob", "address:5.6.7.8")
    now[0] += FAILURE_WINDOW_S
    throttle.begin("name:ana", "address:1.2.3.4")


def test_a_success_does_not_count_and_attempts_at_once_cannot_pass_the_limit_together() -> None:
    throttle = Throttle()
    for _ in range(3 * MAX_FAILURES):
        throttle.begin("name:ana")
        throttle.succeeded("name:ana")
    throttle.begin("name:ana")  # never refused for attempts that succeeded
    # Attempts begun at once (none finished yet) count until they succeed.
    started = threading.Barrier(32)
    refused: list[bool] = []

    def attempt() -> None:
        started.wait()
        try:
            throttle.begin("name:bob")
            refused.append(False)
        except Throttled:
            refused.append(True)

    threads = [threading.Thread(target=attempt) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert refused.count(False) == MAX_FAILURES


def test_an_ipv6_client_is_its_64_and_an_ipv4_client_its_address() -> None:
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1") == "address:2001:db8::/64"
    assert client_key("2001:db8:0:1::1") != client_key("2001:db8::1")
    assert client_key("10.0.0.1") == "address:10.0.0.1"


def test_a_timeline_keeps_the_cards_last_decisions_in_order() -> None:
    timelines = CardTimelines()
    for n in range(TIMELINE_LENGTH + 5):
        verdict = "review" if n % 2 else "approve"
        timelines.record(_Decision(f"t{n}", "card", n / 100, verdict, "m", 1_000 + n, 1_000 + n))
    earlier = timelines.unpack(
        timelines.record(_Decision("last", "card", 0.9, "decline", "m", 9_999, 9_999))
    )
    assert [d["event_time"] for d in earlier] == [1_000 + n for n in range(5, TIMELINE_LENGTH + 5)]
    assert earlier[-1] == {"event_time": 1_014, "score": 0.14, "decision": "approve"}
    assert timelines.record(_Decision("x", "other", 0.1, "approve", "m", 1, 1)) == b""


#: A review as release 0.1.0 wrote it: its reason's words under `label` only.
DECISION_010 = (
    b'{"transaction_id":"t-010","card_id":"card","score":0.62,"decision":"review",'
    b'"model_version":"m","degraded":false,"event_time":1000,"decided_at":1020,'
    b'"reasons":[{"feature":"log_amount","label":"amount 229.90","contribution":0.3}]}'
)


def test_the_console_shows_a_reason_of_a_release_010_decision_by_its_label(
    tmp_path: Path,
) -> None:
    decision = _decode_decision(DECISION_010)
    reasons = [case_reason(msgspec.structs.asdict(r)) for r in decision.reasons]
    shown = {"feature": "log_amount", "text": "amount 229.90", "label": "amount 229.90",
             "contribution": 0.3}  # fmt: skip
    assert reasons == [shown]
    # A decision of this release says it twice; a case a 0.1.0 console stored, as `label` only.
    new = _decode_decision(DECISION_010.replace(b'"label"', b'"text":"amount 229.90","label"'))
    assert [case_reason(msgspec.structs.asdict(r)) for r in new.reasons] == [shown]
    stored_010 = [{"feature": "log_amount", "label": "amount 229.90", "contribution": 0.3}]
    store = CaseStore(str(tmp_path / "review.db"))
    try:
        store.open_cases(
            NewCase(tid, "card", 0.62, "review", "m", 1000, 1020, r, [], DETAILS, [])
            for tid, r in (("t-010", reasons), ("t-stored-by-010", stored_010))
        )
        for tid in ("t-010", "t-stored-by-010"):
            case = store.case(tid)
            assert case is not None and case["reasons"] == [shown]
    finally:
        store.close()
