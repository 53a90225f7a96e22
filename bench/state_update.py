"""What the card state costs per record as a batch spans more input partitions.

    python -m bench.state_update [--batch 50] [--partitions 1,3,12,24] [--rounds 4]

A batch read from a backlog comes from one partition (librdkafka hands out a fetch per
partition), but a live stream's batch gathers what arrived within `max_wait_ms` from every
partition the replica owns: at 5,000 tx/s and 10 ms, about 50 records from all of them. The
benchmark backlog's transactions are spread over P partitions by card (as Kafka's key hash
would) and fed, in order, through `OwnedCardHistory.update` (what a replica runs per batch) in
batches of `--batch` records, after the partitions are restored from an empty changelog on the local
broker. Each round applies fresh offsets; the figure is the best round, in µs per record,
including reading the batch into columns. One JSON line; also written to
bench/results/state-update.json. The changelog topic is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from typing import NamedTuple

import msgspec
from prometheus_client import CollectorRegistry

from bench.harness import BACKLOG_TEMPLATES, REPO, Broker, backlog_templates, connect, tool_parser
from contracts.offsets import SourceOffset
from contracts.transaction import Transaction, decode_transaction
from scorer.columns import TransactionColumns
from stream.card_history_changelog import KafkaChangelog
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from stream.startup.kafka_clients import READER_DEFAULTS

RESULTS = REPO / "bench" / "results" / "state-update.json"


class _Record(NamedTuple):
    """What the state reads of a consumed record."""

    transaction: Transaction
    position: SourceOffset


def _partition_counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,3,12, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"partition counts must be >= 1, got {text!r}")
    return counts


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def microseconds_per_record(
    broker: Broker, transactions: list[Transaction], partitions: int, batch: int, rounds: int
) -> float:
    """Best round's µs per record of `OwnedCardHistory.update` over `transactions` in
    `partitions`."""
    state = OwnedCardHistory(
        KafkaChangelog(
            {**READER_DEFAULTS, "bootstrap.servers": broker.bootstrap},
            broker.topic(f"state-update-{partitions}", partitions),
        ),
        time_scale=1.0,
        metrics=ServiceMetrics(CollectorRegistry()),
    )
    state.restore(list(range(partitions)))
    partition_of = [zlib.crc32(t.card_id.encode()) % partitions for t in transactions]
    next_offset = [0] * partitions
    best = float("inf")
    for round_ in range(rounds + 1):  # round 0 creates the cards: not measured
        records = []
        for transaction, partition in zip(transactions, partition_of, strict=True):
            position = (("transactions", partition), next_offset[partition])
            records.append(_Record(transaction, position))
            next_offset[partition] += 1
        started = time.perf_counter()
        for start in range(0, len(records), batch):
            part = records[start : start + batch]
            columns = TransactionColumns.from_transactions([r.transaction for r in part])
            state.update(part, columns)
        if round_:
            best = min(best, time.perf_counter() - started)
    return best / len(transactions) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("python -m bench.state_update", __doc__)
    parser.add_argument(
        "--batch", type=_positive, default=50, help="records per batch (default %(default)s)"
    )
    parser.add_argument(
        "--partitions",
        type=_partition_counts,
        default=[1, 3, 12, 24],
        help="partition counts to measure, comma-separated (default 1,3,12,24)",
    )
    parser.add_argument(
        "--rounds", type=_positive, default=4, help="measured rounds each (default %(default)s)"
    )
    args = parser.parse_args(argv)
    broker = connect("bench.state_update", args.bootstrap_servers)
    if broker is None:
        return 2
    transactions = [
        decode_transaction(msgspec.json.encode(record))
        for record in backlog_templates(BACKLOG_TEMPLATES)
    ]
    try:
        figures = {
            "batch": args.batch,
            "records": len(transactions),
            "rounds": args.rounds,
            "us_per_record": {
                str(p): round(
                    microseconds_per_record(broker, transactions, p, args.batch, args.rounds), 2
                )
                for p in args.partitions
            },
        }
    finally:
        broker.delete_topics()
    print(json.dumps(figures))
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
