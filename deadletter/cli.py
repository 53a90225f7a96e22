"""`fraud-dlq`: look at the dead-letter topic.

`inspect` reads the topic from its start to its current end (it joins no group and commits
nothing), counts dead letters by reason, error class and original topic, gives their time range,
and can show the records with their decoded headers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import cast

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from deadletter.record import FAILED_AT, ORIGINAL_TOPIC, REASON, decode_headers

READ_TIMEOUT_S = 10.0
#: consume() waits this long for a full batch; short, so the end of the topic is seen at once.
CONSUME_WAIT_S = 0.2
#: Characters of a value shown per record; dead letters can be large and binary.
VALUE_PREVIEW_CHARS = 200


def read_dead_letters(bootstrap: str, topic: str, extra: dict[str, str]) -> Iterator[Message]:
    """Every record of `topic` from the start of each partition to its end at call time."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"fraud-dlq-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        **extra,
    })  # fmt: skip
    try:
        metadata = consumer.list_topics(topic, timeout=READ_TIMEOUT_S).topics[topic]
        if metadata.error is not None:
            raise KafkaException(metadata.error)
        ends: dict[int, int] = {}
        starts = []
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=READ_TIMEOUT_S
            )
            if high > low:
                ends[partition] = high
                starts.append(TopicPartition(topic, partition, low))
        consumer.assign(starts)
        last_progress = time.monotonic()
        while ends:
            messages = consumer.consume(500, CONSUME_WAIT_S)
            if not messages:
                if time.monotonic() - last_progress > READ_TIMEOUT_S:
                    raise TimeoutError(f"no records from {topic!r} for {READ_TIMEOUT_S}s")
                continue
            last_progress = time.monotonic()
            for message in messages:
                if message.error() is not None:
                    continue
                partition, offset = cast(int, message.partition()), cast(int, message.offset())
                if partition in ends and offset < ends[partition]:
                    yield message
                if partition in ends and offset >= ends[partition] - 1:
                    del ends[partition]
    finally:
        consumer.close()


def inspect(args: argparse.Namespace) -> int:
    by_reason: Counter[str] = Counter()
    by_error: Counter[str] = Counter()
    by_topic: Counter[str] = Counter()
    first_ms: int | None = None
    last_ms: int | None = None
    shown: list[dict[str, object]] = []
    total = 0
    for message in read_dead_letters(args.bootstrap_servers, args.dlq_topic, {}):
        total += 1
        headers = decode_headers(cast(list[tuple[str, bytes]], message.headers()))
        by_reason[headers.get(REASON, "?")] += 1
        by_error[headers.get("dlq.error", "?")] += 1
        by_topic[headers.get(ORIGINAL_TOPIC, "?")] += 1
        failed_at = int(headers.get(FAILED_AT, "0") or 0)
        first_ms = failed_at if first_ms is None else min(first_ms, failed_at)
        last_ms = failed_at if last_ms is None else max(last_ms, failed_at)
        if len(shown) < args.show:
            value = message.value() or b""
            shown.append({
                "partition": message.partition(),
                "offset": message.offset(),
                "key": (message.key() or b"").decode("utf-8", "replace"),
                "value": value[:VALUE_PREVIEW_CHARS].decode("utf-8", "replace"),
                "headers": headers,
            })  # fmt: skip
    summary = {
        "topic": args.dlq_topic,
        "total": total,
        "by_reason": dict(by_reason),
        "by_error": dict(by_error),
        "by_original_topic": dict(by_topic),
        "first_failed_at": first_ms,
        "last_failed_at": last_ms,
        "records": shown,
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{total} dead letters in {args.dlq_topic}")
    if total:
        print(f"  from {_when(first_ms)} to {_when(last_ms)}")
        for title, counts in (("reason", by_reason), ("error", by_error), ("topic", by_topic)):
            print(f"  by {title}: " + ", ".join(f"{k}={v}" for k, v in counts.most_common()))
    for record in shown:
        print(f"\n{args.dlq_topic}[{record['partition']}]@{record['offset']} key={record['key']!r}")
        print(f"  value: {record['value']!r}")
        for key, text in cast(dict[str, str], record["headers"]).items():
            print(f"  {key}: {text if len(text) < 300 else text[:300] + '…'}")
    return 0


def _when(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch_ms / 1000)) + " UTC"


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="fraud-dlq", description="Look at dead letters.")
    parser.add_argument(
        "--bootstrap-servers",
        default=env("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
        help="Kafka bootstrap servers [env KAFKA_BOOTSTRAP_SERVERS; default: %(default)s]",
    )
    parser.add_argument(
        "--dlq-topic",
        default=env("FRAUD_DLQ_TOPIC", "transactions.dlq"),
        help="dead-letter topic [env FRAUD_DLQ_TOPIC; default: %(default)s]",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    inspect_parser = commands.add_parser(
        "inspect",
        help="count dead letters by reason, error, original topic and time",
        description="Read the dead-letter topic to its current end and summarise it.",
    )
    inspect_parser.add_argument(
        "--show",
        type=int,
        default=0,
        metavar="N",
        help="also print the first N records with their headers (default: 0)",
    )
    inspect_parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "inspect" and args.show < 0:
        print(f"fraud-dlq: --show must be >= 0, got {args.show}", file=sys.stderr)
        return 2
    try:
        return inspect(args)
    except (KafkaException, TimeoutError) as exc:
        print(f"fraud-dlq: cannot read {args.dlq_topic!r}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
