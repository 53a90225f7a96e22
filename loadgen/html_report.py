"""`fraud-loadgen --report DIR`: one self-contained HTML page of a load run, viewable offline.

Built from the run's JSON summary alone (the same dict `--json` prints), with inline SVG
charts: latency percentiles and throughput over time, and what the scorer's /metrics said
during the run (batch-size distribution, mean batch size and cap, consumer lag).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from loadgen.svg import Series, bar_chart, line_chart

REPORT_FILE = "index.html"
SUMMARY_FILE = "summary.json"

P50_COLOR, P95_COLOR, P99_COLOR, MAX_COLOR = "#4c78a8", "#f58518", "#e45756", "#9d9d9d"
TARGET_COLOR, SENT_COLOR, DECIDED_COLOR = "#9d9d9d", "#4c78a8", "#54a24b"
LAG_COLOR, CAP_COLOR = "#b279a2", "#9d9d9d"
SECOND_MIDDLE_S = 0.5

#: (summary key, label) of the key-figures table, in display order.
KEY_FIGURES: tuple[tuple[str, str], ...] = (
    ("sent", "sent"),
    ("decided", "decided"),
    ("dead_letters", "dead letters"),
    ("lost", "lost"),
    ("duplicates", "duplicates"),
    ("target_rate", "target rate (tx/s, mean)"),
    ("achieved_rate", "achieved send rate (tx/s)"),
    ("decided_per_s", "decisions/s over the run"),
    ("p50_ms", "event→decision p50 (ms)"),
    ("p95_ms", "event→decision p95 (ms)"),
    ("p99_ms", "event→decision p99 (ms)"),
    ("max_ms", "event→decision max (ms)"),
    ("fraud_labelled", "simulated fraud sent"),
    ("fraud_caught", "fraud caught (review or decline)"),
    ("fraud_recall", "fraud recall"),
    ("false_positive_rate", "false-positive rate (legitimate flagged)"),
    ("schedule_lag_max_ms", "sender's worst lag behind schedule (ms)"),
)
#: Key figures that are shares (0..1), shown as percentages.
SHARES = frozenset({"fraud_recall", "false_positive_rate"})

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 940px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 16px; margin: 28px 0 6px; }
p.meta, p.note { color: #555; margin: 4px 0; }
table { border-collapse: collapse; margin-top: 12px; }
td { padding: 3px 14px 3px 0; border-bottom: 1px solid #eee; }
td.value { text-align: right; font-variant-numeric: tabular-nums; font-weight: 600; }
td.bad { color: #c0392b; }
figure { margin: 0; }
"""


def _column(rows: Sequence[Mapping[str, Any]], key: str) -> list[float | None]:
    return [None if row.get(key) is None else float(row[key]) for row in rows]


def _times(rows: Sequence[Mapping[str, Any]], offset_s: float = 0.0) -> list[float]:
    return [float(row["t_s"]) + offset_s for row in rows]


def _seconds(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """The middle of each one-second row, where its figures belong on a time axis."""
    return _times(rows, SECOND_MIDDLE_S)


def _send_seconds(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> int:
    """Whole seconds of the sending schedule: the rows after them are the drain."""
    duration = summary.get("duration_s")
    return math.ceil(float(duration)) if duration else len(rows)


def _plotted_rows(
    summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]
) -> Sequence[Mapping[str, Any]]:
    """The one-second rows worth a point on a chart: all but a last one in the drain, which
    only covers the moment the last decisions came in and would draw as a collapse to zero."""
    if rows and int(rows[-1]["t_s"]) >= _send_seconds(summary, rows):
        return rows[:-1]
    return rows


def _figure(heading: str, caption: str, svg: str) -> str:
    return f"<h2>{escape(heading)}</h2><p class='note'>{escape(caption)}</p><figure>{svg}</figure>"


def _latency_figure(rows: Sequence[Mapping[str, Any]], x_range: tuple[float, float]) -> str:
    t = _seconds(rows)
    series = [
        Series("p50", t, _column(rows, "p50_ms"), P50_COLOR),
        Series("p95", t, _column(rows, "p95_ms"), P95_COLOR),
        Series("p99", t, _column(rows, "p99_ms"), P99_COLOR),
        Series("max", t, _column(rows, "max_ms"), MAX_COLOR, dashed=True),
    ]
    return _figure(
        "Event→decision latency over time",
        "Percentiles of the transactions sent in each second (log scale).",
        line_chart(
            "Latency percentiles over time",
            series,
            x_label="seconds since start",
            y_label="milliseconds",
            log_y=True,
            x_range=x_range,
        ),
    )


def _throughput_figure(
    rows: Sequence[Mapping[str, Any]],
    x_range: tuple[float, float],
    send_seconds: int,
    left_out: Mapping[str, Any] | None,
) -> str:
    t = _seconds(rows)
    # Sending stops with the schedule: no "sent" or "target" line through the drain.
    scheduled = [row if int(row["t_s"]) < send_seconds else {} for row in rows]
    series = [
        Series("target", t, _column(scheduled, "target"), TARGET_COLOR, dashed=True),
        Series("sent", t, _column(scheduled, "sent"), SENT_COLOR),
        Series("decided", t, _column(rows, "decided"), DECIDED_COLOR),
    ]
    caption = "Transactions due by the schedule, sent, and decided in each second."
    if left_out is not None:
        caption += (
            f" The last {left_out['decided']:,} decisions came in during second "
            f"{int(left_out['t_s']):,}, after sending stopped; that partial second is not drawn."
        )
    return _figure(
        "Throughput over time",
        caption,
        line_chart(
            "Throughput over time",
            series,
            x_label="seconds since start",
            y_label="records/s",
            x_range=x_range,
        ),
    )


def _scorer_figures(summary: Mapping[str, Any], x_range: tuple[float, float]) -> list[str]:
    source = summary.get("metrics_url") or "the scorer's /metrics"
    scraped: Sequence[Mapping[str, Any]] = summary.get("scraped") or []
    batch_sizes: Mapping[str, int] = summary.get("batch_sizes") or {}
    if not scraped and not batch_sizes:
        return [
            "<h2>Scorer metrics</h2><p class='note'>No batch-size or lag figures: "
            f"{escape(str(source))} could not be scraped during the run.</p>"
        ]
    figures = []
    if batch_sizes:
        figures.append(
            _figure(
                "Batch-size distribution",
                f"Micro-batches scored during the run, by size bucket (from {source}).",
                bar_chart(
                    "Batch-size distribution",
                    list(batch_sizes),
                    [float(v) for v in batch_sizes.values()],
                    x_label="records per batch (histogram bucket)",
                    y_label="batches",
                ),
            )
        )
    if scraped:
        t = _times(scraped)
        figures.append(
            _figure(
                "Batch size over time",
                "Mean records per batch in each scrape interval, and the batch cap.",
                line_chart(
                    "Batch size over time",
                    [
                        Series(
                            "mean batch size", t, _column(scraped, "mean_batch_size"), P50_COLOR
                        ),
                        Series("cap", t, _column(scraped, "batch_cap"), CAP_COLOR, dashed=True),
                    ],
                    x_label="seconds since start",
                    y_label="records",
                    x_range=x_range,
                ),
            )
        )
        figures.append(
            _figure(
                "Consumer lag over time",
                "Records not yet committed, summed over the replica's partitions.",
                line_chart(
                    "Consumer lag over time",
                    [Series("lag", t, _column(scraped, "lag_records"), LAG_COLOR)],
                    x_label="seconds since start",
                    y_label="records",
                    x_range=x_range,
                ),
            )
        )
    return figures


def _key_figures(summary: Mapping[str, Any]) -> str:
    cells = []
    for key, label in KEY_FIGURES:
        value = summary.get(key)
        text = _format_figure(key, value)
        bad = " bad" if key in ("lost", "duplicates") and value else ""
        cells.append(
            f"<tr><td>{escape(label)}</td><td class='value{bad}'>{escape(str(text))}</td></tr>"
        )
    return "<table>" + "".join(cells) + "</table>"


def _format_figure(key: str, value: Any) -> str:
    if value is None:
        return "n/a"
    if key in SHARES:
        return f"{float(value) * 100:.1f} %"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def render_report(summary: Mapping[str, Any]) -> str:
    """The HTML page of one run's summary."""
    all_rows: Sequence[Mapping[str, Any]] = summary.get("over_time") or []
    rows = _plotted_rows(summary, all_rows)
    left_out = all_rows[-1] if len(rows) < len(all_rows) else None
    scraped: Sequence[Mapping[str, Any]] = summary.get("scraped") or []
    # The time axis ends with the last plotted second (or scrape), not at a round number.
    x_range = (0.0, max([1.0, *_times(rows, 1.0), *_times(scraped)]))
    shape = summary.get("shape", "constant")
    meta = (
        f"shape {shape}, rate {summary.get('rate', 'n/a')} tx/s, "
        f"duration {summary.get('duration_s', 'n/a')} s, "
        f"malformed share {summary.get('bad_ratio', 0)}, started {summary.get('started_at', '')}"
    )
    body = [
        "<h1>fraud-loadgen run</h1>",
        f"<p class='meta'>{escape(meta)}</p>",
        _key_figures(summary),
        _latency_figure(rows, x_range),
        _throughput_figure(rows, x_range, _send_seconds(summary, all_rows), left_out),
        *_scorer_figures(summary, x_range),
    ]
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>fraud-loadgen: {escape(str(shape))} run</title><style>{_STYLE}</style></head>"
        "<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_report(directory: Path, summary: Mapping[str, Any]) -> Path:
    """Write the page (and the summary it shows, as JSON) into `directory`; return the page."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    page = directory / REPORT_FILE
    page.write_text(render_report(summary))
    return page
