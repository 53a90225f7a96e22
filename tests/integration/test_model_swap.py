"""Hot reload through the real broker: `fraud-model promote` under 5,000 tx/s swaps the model of a
running replica between batches, with nothing lost and every decision made by one of the two; a
broken package promoted after it is refused and the model before keeps serving."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path

from model_tools.cli import main as fraud_model
from simulator.transactions import TransactionSimulator
from tests.integration.conftest import Topics, fed_by_loadgen, produce, read_topic, run_loadgen
from tests.support.models import nan_on_burst_model, nan_on_history_model, package
from tests.support.records import value_of
from tests.unit.test_model_reload import package_copy

RATE = 5_000
DURATION_S = 8
#: When, into the load run, the new package is promoted.
PROMOTE_AT_S = 3.0
POLL_S = "0.2"
#: The load rate while a broken package is refused.
BROKEN_RATE = 500


def test_a_promotion_under_load_swaps_between_batches_and_loses_nothing(
    topics_factory, service_factory, tmp_path: Path
):
    link = tmp_path / "champion"
    v1, v2 = package_copy(tmp_path / "v1", "swap-v1"), package_copy(tmp_path / "v2", "swap-v2")
    assert fraud_model(["promote", str(v1), "--source", str(link)]) == 0
    topics = topics_factory(partitions=3)
    service = service_factory(
        topics, "--model-path", str(link), "--model-poll-s", POLL_S, *fed_by_loadgen(RATE)
    )
    service.wait_for_metric("fraud_records_consumed_total", 0)

    def promote_midway() -> None:
        time.sleep(PROMOTE_AT_S)
        assert fraud_model(["promote", str(v2), "--source", str(link)]) == 0

    promoter = threading.Thread(target=promote_midway)
    promoter.start()
    try:
        summary = loadgen_summary(topics, service.metrics_port)
    finally:
        promoter.join()
    assert summary["lost"] == 0 and summary["duplicates"] == 0
    assert summary["decided"] == summary["sent"] >= RATE * DURATION_S * 0.9

    decisions = read_topic(topics.output, summary["sent"])
    versions: dict[int | None, list[str]] = defaultdict(list)
    for message in decisions:
        versions[message.partition()].append(json.loads(value_of(message))["model_version"])
    assert {v for seen in versions.values() for v in seen} == {"swap-v1", "swap-v2"}
    for partition, seen in versions.items():
        first_v2 = seen.index("swap-v2")
        assert set(seen[first_v2:]) == {"swap-v2"}, f"partition {partition} went back to v1"
    assert service.metric('fraud_model_reloads_total{result="loaded",role="served"}') == 1

    # How fast the batches around the swap are decided is a timing goal, not asserted here: on a
    # loaded 2-core machine their p99 once passed the 1 s deadline by 5 ms.


def test_a_broken_package_is_refused_and_the_model_before_keeps_serving(
    topics_factory, service_factory, tmp_path: Path
):
    link = tmp_path / "champion"
    good, broken = package_copy(tmp_path / "good", "good"), package_copy(tmp_path / "bad", "bad")
    assert fraud_model(["promote", str(good), "--source", str(link)]) == 0
    topics = topics_factory(partitions=1)
    service = service_factory(
        topics, "--model-path", str(link), "--model-poll-s", POLL_S, *fed_by_loadgen(BROKEN_RATE)
    )
    service.wait_for_metric("fraud_records_consumed_total", 0)
    assert fraud_model(["promote", str(broken), "--source", str(link)]) == 0
    (broken / "model.onnx").write_bytes(b"\x08\x07 not a graph")  # spoiled after promotion
    service.wait_for_metric('fraud_model_reloads_total{result="refused",role="served"}', 1)

    summary = loadgen_summary(topics, service.metrics_port, rate=BROKEN_RATE, duration_s=2)
    assert summary["lost"] == 0
    decisions = read_topic(topics.output, summary["sent"])
    assert {json.loads(value_of(m))["model_version"] for m in decisions} == {"good"}
    assert service.metric('fraud_model_reloads_total{result="loaded",role="served"}') == 0


def loadgen_summary(
    topics: Topics, metrics_port: int, rate: int = RATE, duration_s: int = DURATION_S
) -> dict[str, int]:
    result = run_loadgen(
        topics,
        metrics_port,
        "--rate",
        str(rate),
        "--duration",
        str(duration_s),
        timeout_s=duration_s + 120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary: dict[str, int] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary


#: Cards of the NaN-model runs: each batch holds cards seen before, which the model fails.
NAN_CARDS = 20


def card_transactions(count: int, start: int = 0) -> list[tuple[bytes | None, bytes | None]]:
    """Valid transactions of NAN_CARDS cards taking turns (after each card's first, every one
    has history), keyed by card, event times now."""
    records = TransactionSimulator(11).generate(count).records
    now_ms = time.time_ns() // 1_000_000
    values: list[tuple[bytes | None, bytes | None]] = []
    for i, record in enumerate(records, start=start):
        card = f"card-{i % NAN_CARDS}"
        value = {**record, "card_id": card, "transaction_id": f"nan-{i}", "event_time": now_ms}
        values.append((card.encode(), json.dumps(value).encode()))
    return values


def served_versions(topics: Topics, count: int) -> list[str]:
    return [json.loads(value_of(m))["model_version"] for m in read_topic(topics.output, count)]


def test_a_model_that_fails_recent_real_rows_is_refused_before_it_serves(
    topics_factory, service_factory, tmp_path: Path
):
    """Traffic first, then a model that scores every typical row but NaN for a burst of a
    card's transactions, which this traffic is: the recent real rows refuse it; nothing is
    dead-lettered."""
    link = tmp_path / "champion"
    assert fraud_model(["promote", str(package_copy(tmp_path / "good", "good")), "--source",
                        str(link)]) == 0  # fmt: skip
    topics = topics_factory(partitions=1)
    service = service_factory(topics, "--model-path", str(link), "--model-poll-s", POLL_S)
    produce(topics.input, card_transactions(200))
    service.wait_for_metric("fraud_records_consumed_total", 200)
    bad = package(tmp_path / "burst-nan", nan_on_burst_model(), version="burst-nan")
    assert fraud_model(["promote", str(bad), "--source", str(link)]) == 0
    service.wait_for_metric('fraud_model_reloads_total{result="refused",role="served"}', 1)
    produce(topics.input, card_transactions(200, start=200))
    assert set(served_versions(topics, 400)) == {"good"}
    assert service.metric('fraud_model_reloads_total{result="loaded",role="served"}') == 0
    assert service.metric_total("fraud_poison_records_total") == 0
    assert "recent transactions" in service.log()


def test_a_model_that_fails_most_records_after_the_swap_is_rolled_back(
    topics_factory, service_factory, tmp_path: Path
):
    """Before any traffic, a model that returns NaN for any card with history is refused (the
    typical rows hold such cards). One that fails only bursts passes every check, serves, and
    fails the records of cards seen before: its batch is decided again by the model before it,
    which serves on; the rollback is counted, and nothing is dead-lettered."""
    link = tmp_path / "champion"
    assert fraud_model(["promote", str(package_copy(tmp_path / "good", "good")), "--source",
                        str(link)]) == 0  # fmt: skip
    topics = topics_factory(partitions=1)
    service = service_factory(topics, "--model-path", str(link), "--model-poll-s", POLL_S)
    service.wait_for_metric("fraud_records_consumed_total", 0)
    history = package(tmp_path / "history-nan", nan_on_history_model(), version="history-nan")
    assert fraud_model(["promote", str(history), "--source", str(link)]) == 0
    service.wait_for_metric('fraud_model_reloads_total{result="refused",role="served"}', 1)
    bad = package(tmp_path / "burst-nan", nan_on_burst_model(), version="burst-nan")
    assert fraud_model(["promote", str(bad), "--source", str(link)]) == 0
    service.wait_for_metric('fraud_model_reloads_total{result="loaded",role="served"}', 1)
    produce(topics.input, card_transactions(400))
    versions = served_versions(topics, 400)
    assert len(versions) == 400
    service.wait_for_metric("fraud_model_rollbacks_total", 1)
    # The records the bad model did decide are a card's first ones, before the rollback.
    assert versions.count("burst-nan") <= NAN_CARDS
    assert versions[-1] == "good"
    assert service.metric_total("fraud_poison_records_total") == 0
    assert "rolled back" in service.log()


def test_a_model_that_fails_most_records_with_nothing_to_roll_back_to_dead_letters_none(
    topics_factory, service_factory, tmp_path: Path
):
    """A replica started with a model that passes every check and fails a burst of a card's
    transactions, with no model before it: the traffic is decided by the fallback rules,
    degraded, not dead-lettered as poison."""
    bad = package(tmp_path / "burst-nan", nan_on_burst_model(), version="burst-nan")
    topics = topics_factory(partitions=1)
    service = service_factory(topics, "--model-path", str(bad), "--model-poll-s", "0")
    produce(topics.input, card_transactions(200))
    decisions = [json.loads(value_of(m)) for m in read_topic(topics.output, 200)]
    assert len(decisions) == 200
    assert sum(decision["degraded"] for decision in decisions) >= 150
    assert service.metric_total("fraud_poison_records_total") == 0
    assert service.metric('fraud_degraded_decisions_total{cause="model_unavailable"}') >= 150
    assert "no model before it to go back to" in service.log()
