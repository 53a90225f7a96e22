"""fraud-loadgen's traffic shapes, HTML report and replay of a team's recorded rows against the
real broker and a running service."""

from __future__ import annotations

import json
import subprocess
import sys

import msgspec

from loadgen.html_report import REPORT_FILE
from simulator.team_shapes import checkout_event
from simulator.transactions import TransactionSimulator
from tests.integration.conftest import BOOTSTRAP, REPO, run_loadgen

RATE = 200
DURATION_S = 4
BURST_EVERY_S = 2
BURST_FACTOR = 4


def test_burst_run_writes_a_report_and_loses_nothing(topics_factory, service_factory, tmp_path):
    topics = topics_factory(partitions=2)
    service = service_factory(topics)
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
        "0.5",
        "--burst-factor",
        str(BURST_FACTOR),
        "--report",
        str(report_dir),
    )

    assert result.returncode == 0, result.stderr + service.log()
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    # 4 s at 200/s, plus 2 bursts of 0.5 s at 600/s more.
    assert summary["sent"] == RATE * DURATION_S + 2 * 0.5 * RATE * (BURST_FACTOR - 1)
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
