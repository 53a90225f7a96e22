"""`fraud-dlq inspect`: what the dead-letter topic holds, counted and shown.

The report counts the selected dead letters by reason, error class and original topic, gives
the range of their `dlq.failed_at`, and can carry the first records with decoded headers. It
reads the topic from its beginning to its end at the start of the run, joins no group and
commits nothing.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from contracts.dead_letter import ERROR, ORIGINAL_TOPIC, REASON, failed_at_ms
from deadletter.reader import DeadLetter, DeadLetterFilter, DeadLetterReader

#: Characters of a value shown per record: dead letters can be large and binary.
VALUE_PREVIEW_CHARS = 200
#: Characters of one header shown in text (a stack trace would fill the screen).
HEADER_PREVIEW_CHARS = 300
#: Placeholder for a header a dead letter lacks.
UNKNOWN = "?"


def inspect(reader: DeadLetterReader, where: DeadLetterFilter, show: int) -> dict[str, Any]:
    """The report on the dead letters `where` selects, with the first `show` of them.

    Keys: topic, total, by_reason, by_error, by_original_topic, first_failed_at,
    last_failed_at (epoch ms, None without records), records, skipped_by_filter.
    """
    by_reason: Counter[str] = Counter()
    by_error: Counter[str] = Counter()
    by_topic: Counter[str] = Counter()
    # The range only: a topic of millions of dead letters must not be held in memory.
    first: int | None = None
    last: int | None = None
    shown: list[dict[str, Any]] = []
    skipped = 0
    for letter in reader.records(reader.plan(where, resume=False)):
        if not where.matches(letter):
            skipped += 1
            continue
        headers = letter.decoded
        by_reason[headers.get(REASON, UNKNOWN)] += 1
        by_error[headers.get(ERROR, UNKNOWN)] += 1
        by_topic[headers.get(ORIGINAL_TOPIC, UNKNOWN)] += 1
        when = failed_at_ms(headers)
        if when is not None:
            first = when if first is None else min(first, when)
            last = when if last is None else max(last, when)
        if len(shown) < show:
            shown.append(_shown(letter))
    return {
        "topic": reader.topic,
        "total": by_reason.total(),
        "by_reason": dict(by_reason),
        "by_error": dict(by_error),
        "by_original_topic": dict(by_topic),
        "first_failed_at": first,
        "last_failed_at": last,
        "records": shown,
        "skipped_by_filter": skipped,
    }


def _shown(letter: DeadLetter) -> dict[str, Any]:
    return {
        "partition": letter.partition,
        "offset": letter.offset,
        "key": (letter.key or b"").decode("utf-8", "replace"),
        "value": (letter.value or b"")[:VALUE_PREVIEW_CHARS].decode("utf-8", "replace"),
        "headers": letter.decoded,
    }


def render_text(report: dict[str, Any]) -> str:
    """The report of `inspect` for a person to read."""
    topic, total = report["topic"], report["total"]
    skipped = report["skipped_by_filter"]
    lines = [
        f"{total} dead letters selected in {topic} ({skipped} more skipped by the filters)"
        if skipped
        else f"{total} dead letters in {topic}"
    ]
    if total:
        lines.append(
            f"  from {_when(report['first_failed_at'])} to {_when(report['last_failed_at'])}"
        )
        for title, key in (
            ("reason", "by_reason"),
            ("error", "by_error"),
            ("topic", "by_original_topic"),
        ):
            counts = Counter(report[key]).most_common()
            lines.append(f"  by {title}: " + ", ".join(f"{k}={v}" for k, v in counts))
    for record in report["records"]:
        lines.append(f"\n{topic}[{record['partition']}]@{record['offset']} key={record['key']!r}")
        lines.append(f"  value: {record['value']!r}")
        for key, text in record["headers"].items():
            preview = (
                text if len(text) <= HEADER_PREVIEW_CHARS else text[:HEADER_PREVIEW_CHARS] + "…"
            )
            lines.append(f"  {printable(key)}: {printable(preview)}")
    return "\n".join(lines)


def printable(text: str) -> str:
    """`text` safe for a terminal: control and formatting characters (escape sequences,
    right-to-left overrides) shown as escapes, everything else as it is."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _when(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return UNKNOWN
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch_ms / 1000)) + " UTC"
    except (OverflowError, OSError, ValueError):
        return f"{epoch_ms} (epoch ms)"
