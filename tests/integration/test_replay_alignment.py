"""A replay scores with the features of its own time (FRAUD_WAIT_FOR_WORKER, issue 44 item 3),
against the real broker: the same backlog replayed by `fraud-loadgen --replay` at full speed
with the setting on, and at a pace the features worker keeps up with without it, gets the same
feature row in every decision (FRAUD_DECISION_FEATURES=on). The same backlog at full speed
without the setting is the control: the scorer decides it before the worker has counted the
days its terminal windows read, so its rows differ.

Each run has its own topics, worker and scorer. The backlog: 10 days of a few transactions a
day at each of 30 terminals, far in the past, in the transaction contract's own fields. On day
d the terminal windows read days up to d - 7, so days 7-9 carry terminal counts. No labels (a
replay sends none), so the card-fraud columns stay neutral in every run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from contracts.decision import decode_features
from contracts.terminal_risk import DELAY_DAYS, MS_PER_DAY
from scorer.features import FEATURE_NAMES
from terminals.topics import CARD_TABLE_NAME, changelog_topic_name, events_topic_name
from tests.integration.conftest import (
    BOOTSTRAP,
    REPO,
    ServiceProcess,
    Topics,
    read_topic,
)
from tests.integration.features_worker import DAY0, PARTITIONS, WorkerProcess, WorkerTopics
from tests.support.network import free_port

DAYS = 10
TERMINALS = 30
CARDS = 40
#: The paced run: a simulated day every 3 s (the worker publishes a day's counts when its clock
#: is 6 days past them, a day before a window reads them: 3 s of margin over its lag).
PACED_SPEED = MS_PER_DAY / 3_000
FAST_RATE = 20_000
TERMINAL_TX_1D = FEATURE_NAMES.index("terminal_tx_1d")

Rows = dict[str, npt.NDArray[np.float32]]


class ReplayRun(NamedTuple):
    #: Each decision's feature row, by transaction id.
    features: Rows
    #: The scorer's fraud_worker_wait_seconds_total at the end.
    waited_s: float


def backlog() -> list[dict[str, object]]:
    """The rows, in event-time order: 1-4 transactions a day per terminal, between 2 AM and
    10 PM (never near midnight, where a row's day would hang on a millisecond)."""
    rows: list[dict[str, object]] = []
    for day in range(DAYS):
        for minute in range(120, 1_320, 6):
            for terminal in range(TERMINALS):
                if (terminal * 7 + day * 3 + minute) % 97 >= 4:
                    continue
                i = len(rows)
                rows.append(
                    {
                        "transaction_id": f"r-{i}",
                        "card_id": f"c-{(i * 13) % CARDS}",
                        "merchant_id": "m-1",
                        "terminal_id": f"T{terminal}",
                        "amount": 10.0 + (i % 17),
                        "currency": "EUR",
                        "mcc": 5411,
                        "country": "DE",
                        "channel": "pos",
                        "card_present": True,
                        "event_time": (DAY0 + day) * MS_PER_DAY + minute * 60_000 + terminal,
                    }
                )
    return rows


@pytest.fixture
def replay_file(tmp_path: Path) -> tuple[Path, int]:
    rows = backlog()
    path = tmp_path / "backlog.jsonl"
    path.write_bytes(b"".join(msgspec.json.encode(row) + b"\n" for row in rows))
    return path, len(rows)


@pytest.fixture
def run_topics(admin: AdminClient) -> Iterator[Callable[[], tuple[Topics, WorkerTopics]]]:
    """Each run's topics: the scorer's input (the worker's too), decisions and dead letters,
    and the worker's labels, terminal-risk, card-frauds and progress topics."""
    created: list[str] = []
    app_ids: list[str] = []

    def make() -> tuple[Topics, WorkerTopics]:
        suffix = uuid.uuid4().hex[:10]
        topics = Topics(f"tx-{suffix}", f"decisions-{suffix}", f"tx-{suffix}.dlq", PARTITIONS)
        worker = WorkerTopics(
            topics.input,
            f"labels-{suffix}",
            f"risk-{suffix}",
            topics.dlq,
            f"ff-{suffix}",
            f"cards-{suffix}",
        )
        new = [NewTopic(n, PARTITIONS, 1) for n in (topics.input, topics.output, topics.dlq)]
        new.append(NewTopic(worker.labels, PARTITIONS, 1))
        compacted = {"cleanup.policy": "compact"}
        new += [NewTopic(n, 1, 1, config=compacted) for n in (worker.risk, worker.card_frauds)]
        new.append(NewTopic(worker.progress, 1, 1, config=compacted))
        for future in admin.create_topics(new).values():
            future.result(timeout=30)
        created.extend(t.topic for t in new)
        app_ids.append(worker.app_id)
        return topics, worker

    yield make
    for app_id in app_ids:
        created += [events_topic_name(app_id), changelog_topic_name(app_id)]
        created.append(changelog_topic_name(app_id, CARD_TABLE_NAME))
    existing = set(admin.list_topics(timeout=30).topics)
    names = [n for n in created if n in existing]
    for future in admin.delete_topics(names).values():
        future.result(timeout=30)


@pytest.fixture
def replay(
    run_topics: Callable[[], tuple[Topics, WorkerTopics]],
    replay_file: tuple[Path, int],
    tmp_path: Path,
) -> Iterator[Callable[..., ReplayRun]]:
    processes: list[subprocess.Popen[bytes]] = []

    def run(name: str, pace: tuple[str, str], *scorer_flags: str) -> ReplayRun:
        """Replay the backlog through a fresh worker and scorer at `pace` (fraud-loadgen's
        flags); `scorer_flags`: more flags of `fraud-scorer run`."""
        path, rows = replay_file
        topics, worker_topics = run_topics()
        worker = WorkerProcess(worker_topics, tmp_path / f"worker-{name}.log", tmp_path / name)
        processes.append(worker.start().process)
        port = free_port()
        scorer = ServiceProcess(
            [
                *("--bootstrap-servers", BOOTSTRAP, "--input-topic", topics.input),
                *("--output-topic", topics.output, "--dlq-topic", topics.dlq),
                *("--group-id", f"scorer-{name}-{uuid.uuid4().hex[:8]}", "--instance-id", "a"),
                *("--metrics-host", "127.0.0.1", "--metrics-port", str(port)),
                *("--terminal-risk-topic", worker_topics.risk),
                *("--card-frauds-topic", worker_topics.card_frauds),
                # Event times far in the past: without a deadline the model decides.
                *("--decision-deadline-ms", "0", "--decision-features", "on"),
                *scorer_flags,
            ],
            tmp_path / f"scorer-{name}.log",
            port,
        )
        processes.append(scorer.start().process)
        worker.wait_ready()
        scorer.wait_for_metric("fraud_records_consumed_total", 0)
        result = subprocess.run(
            [
                sys.executable, "-m", "loadgen.cli", "--bootstrap-servers", BOOTSTRAP,
                "--input-topic", topics.input, "--output-topic", topics.output,
                "--dlq-topic", topics.dlq, "--metrics-url", "", "--replay", str(path),
                *pace, "--drain-timeout", "120", "--json", "--quiet",
            ],
            cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:] + scorer.log()[-3000:]
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["decided"] == rows and summary["lost"] == 0, summary
        features: Rows = {}
        for message in read_topic(topics.output, rows):
            decision = json.loads(message.value() or b"{}")
            features[decision["transaction_id"]] = decode_features(decision["features"])
        assert len(features) == rows
        waited_s = scorer.metric("fraud_worker_wait_seconds_total")
        scorer.process.terminate()
        worker.process.terminate()
        return ReplayRun(features, waited_s)

    yield run
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def _differing(a: Rows, b: Rows) -> list[str]:
    return sorted(i for i in a if not np.array_equal(a[i], b[i]))


def test_a_replay_at_full_speed_gets_the_features_of_a_paced_one(
    replay: Callable[..., ReplayRun],
) -> None:
    paced = replay("paced", ("--replay-speed", f"{PACED_SPEED:g}")).features
    late = [i for i, row in paced.items() if row[TERMINAL_TX_1D] > 0]
    # Days DELAY_DAYS.. carry the counts of days 0..: the comparison is not of neutral rows.
    assert len(late) > len(paced) * (DAYS - DELAY_DAYS - 1) / DAYS, len(late)

    aligned = replay("aligned", ("--replay-rate", str(FAST_RATE)), "--wait-for-worker", "on")
    assert aligned.waited_s > 0, "a backlog at full speed must wait for the worker"
    differing = _differing(paced, aligned.features)
    assert not differing, (
        f"{len(differing)} of {len(paced)} rows differ, e.g. {differing[:3]}: "
        f"{[(paced[i].tolist(), aligned.features[i].tolist()) for i in differing[:1]]}"
    )

    unaligned = replay("unaligned", ("--replay-rate", str(FAST_RATE))).features
    assert _differing(paced, unaligned), "the control must show what the setting prevents"
