"""fraud-loadgen's traffic shapes, HTML report and replay of a team's recorded rows against the
real broker and a running service; a first run against a scorer with default settings."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import msgspec
import pytest

from loadgen.html_report import REPORT_FILE
from simulator.team_shapes import checkout_event
from simulator.transactions import TransactionSimulator
from tests.integration.conftest import BOOTSTRAP, REPO, end_offsets, fed_by_loadgen, run_loadgen

RATE = 200
DURATION_S = 4
BURST_EVERY_S = 2
BURST_SECONDS = 0.5
BURST_FACTOR = 4
#: The burst run's mean rate: RATE, plus each burst's extra records spread over its period.
BURST_MEAN_RATE = RATE * (1 + BURST_SECONDS / BURST_EVERY_S * (BURST_FACTOR - 1))


def test_burst_run_writes_a_report_and_loses_nothing(topics_factory, service_factory, tmp_path):
    topics = topics_factory(partitions=2)
    service = service_factory(topics, *fed_by_loadgen(BURST_MEAN_RATE))
    service.wait_for_metric("fraud_records_consumed_total", 0)
    report_dir = tmp_path / "report"

    result = run_loadgen(
        topics,
        service.metrics_port,
        "--shape",
        "burst",
        "--rate",
        str(RATE),
        "--duration",
        str(DURATION_S),
        "--burst-every",
        str(BURST_EVERY_S),
        "--burst-seconds",
        str(BURST_SECONDS),
        "--burst-factor",
        str(BURST_FACTOR),
        "--report",
        str(report_dir),
    )

    assert result.returncode == 0, result.stderr + service.log()
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    # 4 s at 200/s, plus 2 bursts of 0.5 s at 600/s more.
    assert summary["sent"] == BURST_MEAN_RATE * DURATION_S
    assert summary["lost"] == 0 and summary["duplicates"] == 0
    assert summary["decided"] == summary["sent"]
    for key in ("dead_letters", "achieved_rate", "p50_ms", "p95_ms", "p99_ms"):
        assert summary[key] is not None
    rows = summary["over_time"]
    assert sum(row["sent"] for row in rows) == summary["sent"]
    # Each burst closes its period: seconds 1 and 3 carry the bursts.
    assert rows[1]["sent"] > rows[0]["sent"] and rows[3]["sent"] > rows[2]["sent"]
    assert summary["scraped"] and sum(summary["batch_sizes"].values()) >= 1
    page = report_dir / REPORT_FILE
    assert page.is_file()
    assert page.read_text().count("<svg") == 5


REPLAY_ROWS = 100_000


def test_a_teams_recorded_day_replays_through_its_mapping_with_a_report(
    topics_factory, service_factory, tmp_path
):
    # 100,000 rows in the checkout example's own shape, with their labels: what would the
    # service have decided on them?
    simulated = TransactionSimulator(21, id_prefix="day").generate(REPLAY_ROWS)
    day = tmp_path / "day.jsonl"
    with day.open("wb") as out:
        for record, fraud in zip(simulated.records, simulated.is_fraud.tolist(), strict=True):
            out.write(msgspec.json.encode({**checkout_event(record), "is_fraud": fraud}) + b"\n")
    mapping = REPO / "examples" / "checkout" / "mapping.toml"
    topics = topics_factory(partitions=3)
    service = service_factory(topics, "--input-mapping", str(mapping))
    service.wait_for_metric("fraud_records_consumed_total", 0)

    result = subprocess.run(
        [
            sys.executable, "-m", "loadgen.cli", "--bootstrap-servers", BOOTSTRAP,
            "--input-topic", topics.input, "--output-topic", topics.output,
            "--dlq-topic", topics.dlq, "--metrics-url", "",
            "--replay", str(day), "--input-mapping", str(mapping), "--replay-rate", "20000",
            "--drain-timeout", "240", "--report", str(tmp_path / "report"), "--json", "--quiet",
        ],
        cwd=REPO, capture_output=True, text=True, timeout=420, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:] + service.log()
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["shape"] == "replay" and summary["sent"] == REPLAY_ROWS
    assert summary["lost"] == 0 and summary["duplicates"] == 0
    assert summary["decided"] == REPLAY_ROWS and summary["dead_letters"] == 0
    assert summary["fraud_labelled"] == int(simulated.is_fraud.sum()) > 0
    assert summary["fraud_recall"] is not None and summary["false_positive_rate"] is not None
    assert (tmp_path / "report" / REPORT_FILE).is_file()
    print(
        f"\nreplay of {REPLAY_ROWS} rows: recall {summary['fraud_recall']}, false-positive rate "
        f"{summary['false_positive_rate']}, p99 {summary['p99_ms']} ms, "
        f"{summary['decided_per_s']} decisions/s"
    )


#: The issue's first run: 2,000 tx/s, here for about 8.3 simulated days.
FIRST_RUN_RATE = 2_000
FIRST_RUN_S = 40
FIRST_RUN_PARTITIONS = 2
#: A load generator and a scorer that disagreed on simulated time flagged 12 % of legitimate
#: traffic. Agreeing, every card still starts without history: a model trained on steady weeks
#: alone flagged 3.7 % of this run (5.6 % in its first half); the shipped one, which also trains
#: on a stream's first days, 0.5-0.6 % (three runs).
MAX_FALSE_POSITIVE_RATE = 0.03
#: The setting the load generator's refusal gives for both services.
SETTING = re.compile(r"start fraud-scorer and fraud-features with FRAUD_HISTORY_TIME_SCALE=(\S+)")


def test_a_first_run_against_a_default_scorer_learns_its_setting_and_flags_few_legit(
    topics_factory, service_factory, monkeypatch: pytest.MonkeyPatch
):
    # Nobody tells either side the time scale: the load generator reads the scorer's, refuses
    # at once with the one setting to use, and the scorer started with it agrees.
    topics = topics_factory(partitions=FIRST_RUN_PARTITIONS)
    default = service_factory(topics)
    default.wait_for_metric("fraud_history_time_scale", 1)
    run = ("--rate", str(FIRST_RUN_RATE), "--duration", str(FIRST_RUN_S), "--no-labels")

    refused = run_loadgen(topics, default.metrics_port, *run)

    assert refused.returncode == 2, refused.stderr + refused.stdout
    line = refused.stderr.strip()
    assert "\n" not in line and not refused.stdout, refused.stderr
    found = SETTING.search(line)
    assert found, line
    assert end_offsets(topics.input, FIRST_RUN_PARTITIONS) == dict.fromkeys(
        range(FIRST_RUN_PARTITIONS), 0
    ), "a refused run sent records"
    default.signal(signal.SIGTERM)
    assert default.wait() == 0, default.log()

    monkeypatch.setenv("FRAUD_HISTORY_TIME_SCALE", found.group(1))
    agreed = service_factory(topics, instance="b")
    agreed.wait_for_metric("fraud_history_time_scale", float(found.group(1)))
    result = run_loadgen(topics, agreed.metrics_port, *run, timeout_s=FIRST_RUN_S + 120)

    assert result.returncode == 0, result.stderr[-3000:] + agreed.log()
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["lost"] == 0 and summary["sent"] == FIRST_RUN_RATE * FIRST_RUN_S
    assert summary["time_scale"] == round(float(found.group(1)), 1)
    first_half, second_half = summary["false_positive_rate_halves"]
    print(
        f"\nfirst run, {FIRST_RUN_RATE} tx/s for {FIRST_RUN_S} s at "
        f"FRAUD_HISTORY_TIME_SCALE={found.group(1)}: false-positive rate "
        f"{summary['false_positive_rate']} (halves {first_half}, {second_half}), recall "
        f"{summary['fraud_recall']}"
    )
    assert summary["false_positive_rate"] < MAX_FALSE_POSITIVE_RATE
