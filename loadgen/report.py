"""The load run's outcome: match what was sent with what came back, and summarise it, overall
and second by second."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

_MS_PER_S = 1000
#: The text summary prints the per-second table only up to this many rows (the JSON line and
#: the HTML report always hold all of them).
MAX_TEXT_ROWS = 60
#: The fraud recall over time is shown per this many seconds of the run.
RECALL_EVERY_S = 10


@dataclass
class SentLog:
    """What the load generator sent, one entry per record, in send order."""

    #: Epoch ms when sending started: second 0 of the over-time figures.
    started_ms: int = 0
    transaction_ids: list[str] = field(default_factory=list)
    #: Epoch ms when each record was handed to the producer (also its event_time).
    sent_ms: list[int] = field(default_factory=list)
    is_fraud: list[bool] = field(default_factory=list)
    scenario: list[str] = field(default_factory=list)
    malformed: list[bool] = field(default_factory=list)
    #: False for a replayed row without a label: in neither recall nor false positives.
    labelled: list[bool] = field(default_factory=list)
    #: (partition, offset) of each acknowledged record → its index, to match dead letters.
    positions: dict[tuple[int, int], int] = field(default_factory=dict)
    failed_sends: int = 0


@dataclass
class ReceivedLog:
    """What came back on the decision and dead-letter topics."""

    #: (transaction_id, decision, event_time, decided_at)
    decisions: list[tuple[str, str, int, int]] = field(default_factory=list)
    #: (original partition, original offset)
    dead_letters: list[tuple[int, int]] = field(default_factory=list)
    #: Reviews and declines read, and those of them that carry 3 reasons (docs/reasons.md).
    flagged: int = 0
    flagged_with_reasons: int = 0


def _percentile(values: npt.NDArray[np.float64], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _seconds_since(started_ms: int, epoch_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    # A decision stamped a hair before the run start (clock steps) counts in second 0.
    return np.maximum((epoch_ms - started_ms) // _MS_PER_S, 0)


def over_time(
    started_ms: int,
    sent_ms: npt.NDArray[np.int64],
    event_ms: npt.NDArray[np.int64],
    decided_ms: npt.NDArray[np.int64],
    target_per_s: Sequence[float] = (),
) -> list[dict[str, float | None]]:
    """Per second of the run: records due (`target`), sent and decided in it, and the
    event→decision latency percentiles of the records sent in it.

    `event_ms` and `decided_ms` belong to the decided records (one entry each); rows run from
    second 0 to the last second in which anything was sent or decided.
    """
    sent_s = _seconds_since(started_ms, sent_ms)
    event_s = _seconds_since(started_ms, event_ms)
    decided_s = _seconds_since(started_ms, decided_ms)
    seconds = max([len(target_per_s), *(int(a.max()) + 1 for a in (sent_s, decided_s) if len(a))])
    sent_counts = np.bincount(sent_s, minlength=seconds)
    decided_counts = np.bincount(decided_s, minlength=seconds)
    order = np.argsort(event_s, kind="stable")
    latency = (decided_ms - event_ms)[order].astype(np.float64)
    bounds = np.searchsorted(event_s[order], np.arange(seconds + 1))
    rows: list[dict[str, float | None]] = []
    for second in range(seconds):
        values = latency[bounds[second] : bounds[second + 1]]
        rows.append(
            {
                "t_s": second,
                "target": round(target_per_s[second], 1) if second < len(target_per_s) else 0.0,
                "sent": int(sent_counts[second]),
                "decided": int(decided_counts[second]),
                "p50_ms": _percentile(values, 50),
                "p95_ms": _percentile(values, 95),
                "p99_ms": _percentile(values, 99),
                "max_ms": float(values.max()) if len(values) else None,
            }
        )
    return rows


def recall_over_time(
    started_ms: int,
    sent_ms: npt.NDArray[np.int64],
    is_fraud: npt.NDArray[np.bool_],
    caught: npt.NDArray[np.bool_],
    every_s: int = RECALL_EVERY_S,
) -> list[dict[str, float | None]]:
    """Recall of the fraud sent in each `every_s` seconds of the run (by send time), so a run
    shows recall rising once labels feed the terminal risk; recall is None without fraud."""
    period = _seconds_since(started_ms, sent_ms) // every_s
    periods = int(period.max()) + 1 if len(period) else 0
    frauds = np.bincount(period[is_fraud], minlength=periods)
    hits = np.bincount(period[is_fraud & caught], minlength=periods)
    return [
        {
            "from_s": i * every_s,
            "to_s": (i + 1) * every_s,
            "fraud": int(frauds[i]),
            "caught": int(hits[i]),
            "recall": round(float(hits[i] / frauds[i]), 4) if frauds[i] else None,
        }
        for i in range(periods)
    ]


def _halves(
    sent_ms: npt.NDArray[np.int64], members: npt.NDArray[np.bool_], caught: npt.NDArray[np.bool_]
) -> list[float | None]:
    """The share of `members` caught in the first and the second half of the sending time: the
    recall of fraud, the false-positive rate of legitimate records."""
    if not len(sent_ms):
        return [None, None]
    second = sent_ms >= (int(sent_ms.min()) + int(sent_ms.max())) / 2
    return [
        round(float(caught[members & half].mean()), 4) if (members & half).any() else None
        for half in (~second, second)
    ]


def summarize(
    sent: SentLog,
    received: ReceivedLog,
    send_seconds: float,
    run_seconds: float,
    target_per_s: Sequence[float] = (),
) -> dict[str, object]:
    """The run's figures; keys are stable (scripts read `--json`)."""
    index_of = {tx: i for i, tx in enumerate(sent.transaction_ids)}
    outcomes = np.zeros(len(sent.transaction_ids), np.int64)
    decision_of: dict[int, str] = {}
    event_ms: list[int] = []
    decided_ms: list[int] = []
    unknown = 0
    for tx, decision, _event_time, decided_at in received.decisions:
        i = index_of.get(tx)
        if i is None:
            unknown += 1
            continue
        outcomes[i] += 1
        if outcomes[i] == 1:
            decision_of[i] = decision
            # From when it was sent: a simulated record's event time, and a replayed one's
            # arrival (its event time is the recorded one).
            event_ms.append(sent.sent_ms[i])
            decided_ms.append(decided_at)
    dead_lettered = 0
    for position in received.dead_letters:
        i = sent.positions.get(position)
        if i is None:
            unknown += 1
            continue
        outcomes[i] += 1
        dead_lettered += outcomes[i] == 1
    events = np.array(event_ms, np.int64)
    decideds = np.array(decided_ms, np.int64)
    latency = (decideds - events).astype(np.float64)
    sent_count = len(sent.transaction_ids)
    malformed = np.array(sent.malformed, bool)
    labelled = np.array(sent.labelled, bool) if sent.labelled else np.ones(sent_count, bool)
    is_fraud = np.array(sent.is_fraud, bool) & ~malformed & labelled
    scenario = np.array(sent.scenario)
    caught = np.array([decision_of.get(i) in ("review", "decline") for i in range(sent_count)])
    declined = np.array([decision_of.get(i) == "decline" for i in range(sent_count)])
    legit = ~is_fraud & ~malformed & labelled
    by_scenario = {
        name: round(float(caught[(scenario == name) & ~malformed].mean()), 4)
        for name in sorted(set(sent.scenario) - {"legit"})
        if ((scenario == name) & ~malformed).any()
    }
    return {
        "sent": sent_count,
        "sent_malformed": int(malformed.sum()),
        "failed_sends": sent.failed_sends,
        "decided": len(decision_of),
        "dead_letters": int(dead_lettered),
        "lost": int((outcomes == 0).sum()),
        "duplicates": int(np.maximum(outcomes - 1, 0).sum()),
        "unexpected_outputs": unknown,
        "send_seconds": round(send_seconds, 3),
        "achieved_rate": round(sent_count / send_seconds, 1) if send_seconds > 0 else 0.0,
        "decided_per_s": round(len(decision_of) / run_seconds, 1) if run_seconds > 0 else 0.0,
        "p50_ms": _percentile(latency, 50),
        "p95_ms": _percentile(latency, 95),
        "p99_ms": _percentile(latency, 99),
        "max_ms": float(latency.max()) if len(latency) else None,
        "decisions": dict(Counter(decision_of.values())),
        "flagged_with_reasons": [received.flagged_with_reasons, received.flagged],
        "fraud_labelled": int(is_fraud.sum()),
        "fraud_caught": int((caught & is_fraud).sum()),
        "fraud_declined": int((declined & is_fraud).sum()),
        "fraud_recall": round(float(caught[is_fraud].mean()), 4) if is_fraud.any() else None,
        "false_positive_rate": round(float(caught[legit].mean()), 4) if legit.any() else None,
        # A card's first simulated days are flagged more (its history is short): the second
        # half shows the rate once histories have filled.
        "false_positive_rate_halves": _halves(np.array(sent.sent_ms, np.int64), legit, caught),
        "recall_by_scenario": by_scenario,
        "fraud_recall_halves": _halves(np.array(sent.sent_ms, np.int64), is_fraud, caught),
        "recall_by_scenario_halves": {
            name: _halves(np.array(sent.sent_ms, np.int64), is_fraud & (scenario == name), caught)
            for name in by_scenario
        },
        "recall_over_time": recall_over_time(
            sent.started_ms, np.array(sent.sent_ms, np.int64), is_fraud, caught
        ),
        "over_time": over_time(
            sent.started_ms, np.array(sent.sent_ms, np.int64), events, decideds, target_per_s
        ),
    }


#: Periods of recall listed one by one; more are drawn as a sparkline (one screen).
MAX_LISTED_PERIODS = 6
_SPARKS = "▁▂▃▄▅▆▇█"


def _recall_periods(rows: list[dict[str, Any]]) -> str:
    """Each period's recall: listed when few, else a sparkline of them (`·`: no fraud)."""
    if len(rows) <= MAX_LISTED_PERIODS:
        return ", ".join(
            f"{row['from_s']}-{row['to_s']} s {row['recall']} ({row['caught']}/{row['fraud']})"
            for row in rows
        )
    recalls = [row["recall"] for row in rows]
    known = [r for r in recalls if r is not None]
    line = "".join(
        "·" if r is None else _SPARKS[min(int(r * len(_SPARKS)), len(_SPARKS) - 1)] for r in recalls
    )
    span = rows[0]["to_s"] - rows[0]["from_s"]
    low_high = f"lowest {min(known)}, highest {max(known)}" if known else "no fraud"
    return f"per {span} s {line} ({low_high}; --report draws it)"


def _of(pair: object) -> str:
    part, whole = pair if isinstance(pair, list) else (0, 0)
    return f"{part} of {whole}"


def _ms(value: object) -> str:
    return "n/a" if value is None else f"{float(str(value)):.0f} ms"


def _over_time_table(rows: list[dict[str, float | None]]) -> list[str]:
    if len(rows) > MAX_TEXT_ROWS:
        return [f"over time       {len(rows)} one-second rows: see --json or --report"]
    lines = ["   t  target/s    sent/s decided/s     p50     p95     p99     max"]
    for row in rows:
        cells = [f"{_ms(row[key]):>7}" for key in ("p50_ms", "p95_ms", "p99_ms", "max_ms")]
        lines.append(
            f"{row['t_s']:>4.0f}  {row['target']:>8.0f}  {row['sent']:>8.0f}  "
            f"{row['decided']:>8.0f} " + " ".join(cells)
        )
    return lines


def _scenario_table(summary: dict[str, object]) -> list[str]:
    """Recall by scenario, one line each: the whole run, then its halves."""
    whole = summary.get("recall_by_scenario")
    if not isinstance(whole, dict) or not whole:
        return []
    halves = summary.get("recall_by_scenario_halves")
    halves = halves if isinstance(halves, dict) else {}
    lines = [f"recall by scenario {'':<20} whole  first half  second half"]
    for name, recall in whole.items():
        first, second = halves.get(name) or (None, None)
        lines.append(f"  {name:<36} {_share(recall):>5}  {_share(first):>10}  {_share(second):>11}")
    return lines


def _share(value: object) -> str:
    return "n/a" if value is None else f"{float(str(value)):.3f}"


def render_text(summary: dict[str, object]) -> str:
    """A human-readable summary block."""
    lines = [
        "── load run summary " + "─" * 44,
        f"sent            {summary['sent']:>10}"
        f"   (malformed on purpose: {summary['sent_malformed']})",
        f"decided         {summary['decided']:>10}",
        f"dead letters    {summary['dead_letters']:>10}",
        f"lost            {summary['lost']:>10}",
        f"duplicates      {summary['duplicates']:>10}",
        f"send rate       {summary['achieved_rate']:>10} tx/s over {summary['send_seconds']} s",
        f"throughput      {summary['decided_per_s']:>10} decisions/s",
        f"event→decision  p50 {_ms(summary['p50_ms'])}, p95 {_ms(summary['p95_ms'])}, "
        f"p99 {_ms(summary['p99_ms'])}, max {_ms(summary['max_ms'])}",
        f"decisions       {summary['decisions']}",
        f"reasons         {_of(summary.get('flagged_with_reasons'))} reviews and declines "
        "carry 3 reasons",
        f"fraud caught    {summary['fraud_caught']} of {summary['fraud_labelled']} labelled "
        f"(review or decline; recall {summary['fraud_recall']}, "
        f"declined {summary['fraud_declined']})",
        f"legit flagged   false-positive rate {summary['false_positive_rate']}"
        + (f", halves {fp}" if (fp := summary.get("false_positive_rate_halves")) else ""),
    ]
    rows = summary.get("recall_over_time")
    if isinstance(rows, list) and rows:
        halves = summary.get("fraud_recall_halves") or [None, None]
        lines.append(f"recall by time  halves {halves}; {_recall_periods(rows)}")
    lines.extend(_scenario_table(summary))
    if "labels_sent" in summary:
        lines.append(
            f"labels sent     {summary['labels_sent']:>10}   (fraud {summary['labels_fraud_sent']}"
            f", failed {summary['labels_failed']}, still to come {summary['labels_pending']}; "
            f"topic {summary['labels_topic']})"
        )
    if "time_scale" in summary:
        lines.append(
            f"simulated time  {summary['time_scale']} x real time (FRAUD_HISTORY_TIME_SCALE)"
        )
    if "shape" in summary:
        lines.append(
            f"schedule        {summary['shape']}, {summary['target_rate']} tx/s on average; "
            f"sender at most {summary['schedule_lag_max_ms']} ms behind it"
        )
    if summary.get("batch_sizes"):
        lines.append(f"batch sizes     {summary['batch_sizes']}")
    rows = summary.get("over_time")
    if isinstance(rows, list) and rows:
        lines.extend(_over_time_table(rows))
    return "\n".join(lines)
