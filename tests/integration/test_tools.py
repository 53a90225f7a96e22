"""The command-line tools against the real broker and a running service."""

from __future__ import annotations

import json

from tests.integration.conftest import BOOTSTRAP, fed_by_loadgen, produce, run_loadgen, run_tool


def test_loadgen_run_reports_every_record_accounted_for(topics_factory, service_factory):
    topics = topics_factory(partitions=2)
    service = service_factory(topics, *fed_by_loadgen(400))
    service.wait_for_metric("fraud_records_consumed_total", 0)

    result = run_loadgen(
        topics, service.metrics_port, "--rate", "400", "--duration", "3", "--bad-ratio", "0.05"
    )

    assert result.returncode == 0, result.stderr + service.log()
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["sent"] == 1200
    assert summary["lost"] == 0 and summary["duplicates"] == 0
    assert summary["decided"] + summary["dead_letters"] == summary["sent"]
    assert summary["dead_letters"] == summary["sent_malformed"] > 0
    assert summary["p50_ms"] is not None and summary["p99_ms"] >= summary["p50_ms"]
    assert sum(summary["batch_sizes"].values()) >= 1
    assert "load run summary" in result.stderr


def test_dlq_inspect_counts_dead_letters_by_reason(topics_factory, service_factory):
    topics = topics_factory(partitions=1)
    produce(topics.input, [(b"a", b"{oops"), (b"b", b'{"transaction_id": 1}'), (b"c", b"[")])
    service = service_factory(topics)
    service.wait_for_metric('fraud_dead_letters_total{reason="decode"}', 2)

    result = run_tool(
        "deadletter.cli",
        "--bootstrap-servers",
        BOOTSTRAP,
        "--dlq-topic",
        topics.dlq,
        "inspect",
        "--json",
        "--show",
        "5",
    )

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["total"] == 3
    assert report["by_reason"] == {"decode": 2, "validate": 1}
    assert report["by_original_topic"] == {topics.input: 3}
    assert report["first_failed_at"] <= report["last_failed_at"]
    assert {r["key"] for r in report["records"]} == {"a", "b", "c"}
    assert all(r["headers"]["dlq.original.topic"] == topics.input for r in report["records"])
