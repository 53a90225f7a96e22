"""The load run's outcome: match what was sent with what came back, and summarise it."""

from __future__ import annotations

import urllib.request
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

BATCH_SIZE_METRIC = "fraud_batch_size_records"
SCRAPE_TIMEOUT_S = 5.0


@dataclass
class SentLog:
    """What the load generator sent, one entry per record, in send order."""

    transaction_ids: list[str] = field(default_factory=list)
    is_fraud: list[bool] = field(default_factory=list)
    scenario: list[str] = field(default_factory=list)
    malformed: list[bool] = field(default_factory=list)
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


def _percentile(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summarize(
    sent: SentLog, received: ReceivedLog, send_seconds: float, run_seconds: float
) -> dict[str, object]:
    """The run's figures; keys are stable (scripts read `--json`)."""
    index_of = {tx: i for i, tx in enumerate(sent.transaction_ids)}
    outcomes = np.zeros(len(sent.transaction_ids), np.int64)
    decision_of: dict[int, str] = {}
    latencies_ms: list[int] = []
    unknown = 0
    for tx, decision, event_time, decided_at in received.decisions:
        i = index_of.get(tx)
        if i is None:
            unknown += 1
            continue
        outcomes[i] += 1
        if outcomes[i] == 1:
            decision_of[i] = decision
            latencies_ms.append(decided_at - event_time)
    dead_lettered = 0
    for position in received.dead_letters:
        i = sent.positions.get(position)
        if i is None:
            unknown += 1
            continue
        outcomes[i] += 1
        dead_lettered += outcomes[i] == 1
    latency = np.array(latencies_ms, np.float64)
    sent_count = len(sent.transaction_ids)
    malformed = np.array(sent.malformed, bool)
    is_fraud = np.array(sent.is_fraud, bool) & ~malformed
    scenario = np.array(sent.scenario)
    caught = np.array([decision_of.get(i) in ("review", "decline") for i in range(sent_count)])
    declined = np.array([decision_of.get(i) == "decline" for i in range(sent_count)])
    legit = ~is_fraud & ~malformed
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
        "fraud_labelled": int(is_fraud.sum()),
        "fraud_caught": int((caught & is_fraud).sum()),
        "fraud_declined": int((declined & is_fraud).sum()),
        "fraud_recall": round(float(caught[is_fraud].mean()), 4) if is_fraud.any() else None,
        "false_positive_rate": round(float(caught[legit].mean()), 4) if legit.any() else None,
        "recall_by_scenario": by_scenario,
    }


def scrape_batch_sizes(metrics_url: str) -> dict[str, float] | None:
    """Cumulative batch-size histogram buckets (le → count) from a scorer's /metrics, or None
    when it cannot be reached."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=SCRAPE_TIMEOUT_S) as response:
            text = response.read().decode()
    except OSError:
        return None
    buckets: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == BATCH_SIZE_METRIC:
            for sample in family.samples:
                if sample.name == BATCH_SIZE_METRIC + "_bucket":
                    buckets[sample.labels["le"]] = sample.value
    return buckets


def batch_size_distribution(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, int] | None:
    """Batches per size range during the run ("≤N" → count), from two scrapes."""
    if not after:
        return None
    before = before or {}
    distribution: dict[str, int] = {}
    previous_total = 0.0
    for le in sorted(after, key=lambda b: float(b)):
        total = after[le] - before.get(le, 0.0)
        count = int(total - previous_total)
        previous_total = total
        if count:
            distribution["+Inf" if le == "+Inf" else f"<={int(float(le))}"] = count
    return distribution


def render_text(summary: dict[str, object]) -> str:
    """A human-readable summary block."""

    def ms(key: str) -> str:
        value = summary[key]
        return "n/a" if value is None else f"{float(str(value)):.0f} ms"

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
        f"event→decision  p50 {ms('p50_ms')}, p95 {ms('p95_ms')}, p99 {ms('p99_ms')}, "
        f"max {ms('max_ms')}",
        f"decisions       {summary['decisions']}",
        f"fraud caught    {summary['fraud_caught']} of {summary['fraud_labelled']} labelled "
        f"(review or decline; recall {summary['fraud_recall']}, "
        f"declined {summary['fraud_declined']})",
        f"legit flagged   false-positive rate {summary['false_positive_rate']}",
        f"recall by scenario {summary['recall_by_scenario']}",
    ]
    if summary.get("batch_sizes"):
        lines.append(f"batch sizes     {summary['batch_sizes']}")
    return "\n".join(lines)
