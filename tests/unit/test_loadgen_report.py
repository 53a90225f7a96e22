"""Unit tests of the load run's figures and its HTML report (loadgen/report.py, scrape.py,
svg.py, html_report.py), from synthetic runs: no broker, no scorer."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from loadgen.html_report import (
    DECIDED_COLOR,
    REPORT_FILE,
    SENT_COLOR,
    SUMMARY_FILE,
    render_report,
    write_report,
)
from loadgen.report import ReceivedLog, SentLog, over_time, render_text, summarize
from loadgen.scrape import (
    MetricsSnapshot,
    batch_size_distribution,
    metrics_over_time,
    parse_metrics,
)
from loadgen.svg import HEIGHT, MARGIN_BOTTOM, Series, line_chart

START_MS = 1_767_571_200_000

METRICS_PAGE = """\
# HELP fraud_batch_size_records Records per scored micro-batch
# TYPE fraud_batch_size_records histogram
fraud_batch_size_records_bucket{le="1.0"} 2.0
fraud_batch_size_records_bucket{le="8.0"} 5.0
fraud_batch_size_records_bucket{le="256.0"} 9.0
fraud_batch_size_records_bucket{le="+Inf"} 9.0
fraud_batch_size_records_count 9.0
fraud_batch_size_records_sum 420.0
# HELP fraud_consumer_lag_records Log end offset minus committed offset, per partition
# TYPE fraud_consumer_lag_records gauge
fraud_consumer_lag_records{partition="0",topic="tx"} 10.0
fraud_consumer_lag_records{partition="1",topic="tx"} 32.0
# HELP fraud_batch_size_cap_records Current cap on records per micro-batch
# TYPE fraud_batch_size_cap_records gauge
fraud_batch_size_cap_records 128.0
"""


def _run(latencies_by_second: list[list[int]]) -> tuple[SentLog, ReceivedLog]:
    """A synthetic run: in second s, one record per latency in latencies_by_second[s], each
    decided that many ms after it was sent; a negative latency is a lost record."""
    sent = SentLog(started_ms=START_MS)
    received = ReceivedLog()
    for second, latencies in enumerate(latencies_by_second):
        for k, latency in enumerate(latencies):
            at = START_MS + second * 1000 + k
            tx = f"t-{second}-{k}"
            sent.transaction_ids.append(tx)
            sent.sent_ms.append(at)
            sent.is_fraud.append(False)
            sent.scenario.append("legit")
            sent.malformed.append(False)
            if latency >= 0:
                received.decisions.append((tx, "approve", at, at + latency))
    return sent, received


def test_over_time_buckets_latency_by_send_second_and_decisions_by_decision_second():
    sent, received = _run([[5, 10, 15, 1200], [20, 30], []])
    summary = summarize(sent, received, 2.0, 3.0, target_per_s=[4.0, 2.0, 1.0])
    rows = summary["over_time"]
    assert isinstance(rows, list)

    assert [row["t_s"] for row in rows] == [0, 1, 2]
    assert [row["target"] for row in rows] == [4.0, 2.0, 1.0]
    assert [row["sent"] for row in rows] == [4, 2, 0]
    # The 1,200 ms record of second 0 was decided in second 1.
    assert [row["decided"] for row in rows] == [3, 3, 0]
    assert rows[0]["p50_ms"] == pytest.approx(12.5)
    assert rows[0]["max_ms"] == 1200.0
    assert rows[1]["p99_ms"] == pytest.approx(29.9)
    assert rows[2]["p50_ms"] is None and rows[2]["max_ms"] is None
    assert summary["sent"] == 6 and summary["decided"] == 6 and summary["lost"] == 0
    assert summary["max_ms"] == 1200.0


def test_over_time_of_an_empty_run_has_one_row_per_scheduled_second():
    empty = np.array([], np.int64)
    rows = over_time(START_MS, empty, empty, empty, [10.0, 10.0])
    assert [(row["sent"], row["decided"], row["p99_ms"]) for row in rows] == [(0, 0, None)] * 2


def test_lost_records_count_as_sent_but_not_decided():
    sent, received = _run([[5, -1, 7]])
    summary = summarize(sent, received, 1.0, 1.0)
    assert summary["lost"] == 1
    rows = summary["over_time"]
    assert isinstance(rows, list)
    assert rows[0]["sent"] == 3
    assert rows[0]["decided"] == 2


def test_text_summary_shows_the_per_second_table():
    sent, received = _run([[5, 10], [20]])
    text = render_text(summarize(sent, received, 2.0, 2.0, target_per_s=[2.0, 1.0]))
    assert "p99" in text and "decided/s" in text
    assert re.search(r"^\s+1\s+1\s+1\s+1\s+20 ms", text, re.MULTILINE)


def test_parse_metrics_reads_batch_histogram_lag_sum_and_cap():
    snapshot = parse_metrics(METRICS_PAGE, at_s=3.0)
    assert snapshot.batch_buckets == {"1.0": 2.0, "8.0": 5.0, "256.0": 9.0, "+Inf": 9.0}
    assert snapshot.batch_count == 9.0 and snapshot.batch_sum == 420.0
    assert snapshot.lag_records == 42.0
    assert snapshot.batch_cap == 128.0


def test_parse_metrics_without_lag_or_cap_reports_none():
    snapshot = parse_metrics("fraud_batch_size_records_count 0.0\n", at_s=0.0)
    assert snapshot.lag_records is None and snapshot.batch_cap is None


def test_batch_size_distribution_and_metrics_over_time_are_differences_between_scrapes():
    before = MetricsSnapshot(10.0, {"1.0": 1.0, "8.0": 1.0, "+Inf": 1.0}, 1.0, 1.0, None, 256.0)
    after = MetricsSnapshot(11.0, {"1.0": 3.0, "8.0": 5.0, "+Inf": 5.0}, 5.0, 21.0, 7.0, 256.0)

    assert batch_size_distribution(before.batch_buckets, after.batch_buckets) == {
        "<=1": 2,
        "<=8": 2,
    }
    assert batch_size_distribution(None, None) is None
    assert metrics_over_time([before, after], origin_s=9.5) == [
        {
            "t_s": 1.5,
            "batches": 4.0,
            "mean_batch_size": 5.0,
            "lag_records": 7.0,
            "batch_cap": 256.0,
        }
    ]


def _synthetic_summary(with_scrapes: bool) -> dict[str, object]:
    sent, received = _run([[4, 6, 9], [8, 12, 400], [7, 9, 11], [3]])
    summary = summarize(sent, received, 4.0, 4.5, target_per_s=[3.0, 3.0, 3.0, 3.0])
    summary.update(shape="burst", rate=3.0, duration_s=4.0, target_rate=3.0)
    if with_scrapes:
        summary["metrics_url"] = "http://127.0.0.1:9102/metrics"
        summary["batch_sizes"] = {"<=1": 3, "<=2": 2, "<=4": 1}
        summary["scraped"] = [
            {"t_s": t, "batches": 2.0, "mean_batch_size": 1.5, "lag_records": lag, "batch_cap": 8.0}
            for t, lag in ((1.0, None), (2.0, 5.0), (3.0, 0.0))
        ]
    return summary


def test_report_has_every_plot_inline_and_fetches_nothing():
    html = render_report(_synthetic_summary(with_scrapes=True))

    assert html.count("<svg") == 5
    for title in (
        "Latency percentiles over time",
        "Throughput over time",
        "Batch-size distribution",
        "Batch size over time",
        "Consumer lag over time",
    ):
        assert f"<title>{title}</title>" in html
    assert html.count("<polyline") >= 6  # data lines, besides each chart's axes
    assert html.count("<rect x=") == 3  # one bar per batch-size bucket
    # Viewable offline: no scripts, no stylesheets or images from elsewhere.
    assert "<script" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<link" not in html


def test_report_without_scrapes_says_why_the_scorer_plots_are_missing():
    html = render_report(_synthetic_summary(with_scrapes=False))
    assert html.count("<svg") == 2
    assert "could not be scraped" in html


def test_write_report_writes_the_page_and_its_summary(tmp_path):
    summary = _synthetic_summary(with_scrapes=True)
    page = write_report(tmp_path / "run", summary)

    assert page == tmp_path / "run" / REPORT_FILE
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert json.loads((tmp_path / "run" / SUMMARY_FILE).read_text())["sent"] == summary["sent"]


def test_line_chart_leaves_gaps_for_missing_points_and_escapes_text():
    svg = line_chart(
        "a <b> & c",
        [Series("p99 <ms>", [0.0, 1.0, 2.0, 3.0], [1.0, None, 3.0, 4.0], "#000")],
        x_label="t",
        y_label="ms",
        log_y=True,
    )
    data_lines = re.findall(r"<polyline points='([^']*)' fill='none' stroke='#000'", svg)
    assert [len(points.split()) for points in data_lines] == [1, 2]
    assert "a &lt;b&gt; &amp; c" in svg and "p99 &lt;ms&gt;" in svg


def _axis_labels(svg: str) -> list[str]:
    """The x-axis tick labels of a chart (text anchored in the middle, below the plot)."""
    return re.findall(r"<text x='[\d.]+' y='290' text-anchor='middle'[^>]*>([^<]*)</text>", svg)


def _run_summary(seconds: int, rate: int, drain: list[int]) -> dict[str, object]:
    """A constant run of `seconds` at `rate` decided within the second, then `drain`: the
    decisions of the seconds after sending stopped."""
    rows = [
        {
            "t_s": t,
            "target": float(rate),
            "sent": rate,
            "decided": rate,
            "p50_ms": 5.0,
            "p95_ms": 9.0,
            "p99_ms": 12.0,
            "max_ms": 20.0,
        }
        for t in range(seconds)
    ] + [
        {
            "t_s": seconds + i,
            "target": 0.0,
            "sent": 0,
            "decided": decided,
            "p50_ms": None,
            "p95_ms": None,
            "p99_ms": None,
            "max_ms": None,
        }
        for i, decided in enumerate(drain)
    ]
    return {"over_time": rows, "duration_s": float(seconds), "sent": seconds * rate}


def _points(svg: str, color: str) -> list[tuple[float, ...]]:
    lines = re.findall(rf"<polyline points='([^']*)' fill='none' stroke='{color}'", svg)
    return [tuple(map(float, p.split(","))) for line in lines for p in line.split()]


def test_the_time_axis_ends_with_the_run_not_at_the_next_round_number():
    # A 30 s run with a partial drain second once got an axis to 40 s: a quarter left empty.
    html = render_report(_run_summary(30, 1000, drain=[12]))
    throughput = html[html.index("<title>Throughput over time</title>") :]
    labels = _axis_labels(throughput[: throughput.index("</svg>")])
    assert labels[0] == "0" and labels[-1] == "30", labels
    assert "40" not in labels


def test_the_final_partial_drain_second_is_not_drawn_as_a_collapse():
    html = render_report(_run_summary(30, 1000, drain=[800, 12]))
    throughput = html[html.index("<title>Throughput over time</title>") :]
    svg = throughput[: throughput.index("</svg>")]
    decided = _points(svg, DECIDED_COLOR)
    sent = _points(svg, SENT_COLOR)
    # 30 scheduled seconds and one full drain second decided; the last, partial one is left
    # out (and said so); nothing was sent after the schedule.
    assert len(decided) == 31 and len(sent) == 30
    assert "The last 12 decisions came in during second 31" in html
    # The line ends at the drain second's 800, not in a fall to 12.
    zero_y = HEIGHT - MARGIN_BOTTOM
    full_y = decided[0][1]
    assert decided[-1][1] == pytest.approx(zero_y - 0.8 * (zero_y - full_y), abs=0.2)


def test_key_figures_show_recall_and_false_positives_and_separate_thousands():
    summary = _synthetic_summary(with_scrapes=False)
    summary.update(sent=123_456, fraud_recall=0.8766, false_positive_rate=0.0123)
    html = render_report(summary)
    assert re.search(r"<td>fraud recall</td><td class='value'>87\.7 %</td>", html)
    assert re.search(r"false-positive rate[^<]*</td><td class='value'>1\.2 %</td>", html)
    assert "<td class='value'>123,456</td>" in html


def test_tick_and_bar_labels_separate_thousands():
    svg = line_chart(
        "t", [Series("s", [0.0, 1.0], [0.0, 25_000.0], "#000")], x_label="x", y_label="y"
    )
    assert ">25,000</text>" in svg and ">25k<" not in svg


def test_batch_size_distribution_keeps_empty_buckets_below_the_largest_batch():
    before = {"1.0": 0.0, "2.0": 0.0, "4.0": 0.0, "8.0": 0.0, "16.0": 0.0, "+Inf": 0.0}
    after = {"1.0": 3.0, "2.0": 3.0, "4.0": 3.0, "8.0": 7.0, "16.0": 7.0, "+Inf": 7.0}
    assert batch_size_distribution(before, after) == {"<=1": 3, "<=2": 0, "<=4": 0, "<=8": 4}


def test_the_summary_says_how_many_flagged_decisions_carry_their_reasons():
    sent, received = _run([[5, 10, 15]])
    received.flagged, received.flagged_with_reasons = 4, 3
    summary = summarize(sent, received, 1.0, 1.0)
    assert summary["flagged_with_reasons"] == [3, 4]
    assert "reasons         3 of 4 reviews and declines carry 3 reasons" in render_text(summary)


def test_text_summary_gives_each_scenario_one_short_line_with_its_halves():
    sent, received = _run([[5, 5], [5, 5]])
    sent.is_fraud[:] = [True, True, True, False]
    sent.scenario[:] = ["compromised_terminal", "card_testing", "compromised_terminal", "legit"]
    received.decisions = [
        (tx, "decline" if tx == "t-0-0" else "approve", at, at + 5)
        for tx, _, at, _ in received.decisions
    ]

    lines = render_text(summarize(sent, received, 2.0, 2.0)).splitlines()

    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("  ")}
    assert rows["compromised_terminal"] == ["0.500", "1.000", "0.000"]
    assert rows["card_testing"] == ["0.000", "0.000", "n/a"]
    assert max(map(len, lines)) <= 80
