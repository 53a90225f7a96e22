"""How long a partition's card state takes to restore from its changelog, and what it holds in
memory (issue: per-card state, "restore time for a partition is measured and reported").

    python -m bench.state_restore [--cards 1000000] [--bootstrap-servers 127.0.0.1:9092]

It writes one state record per card to partition 0 of a fresh one-partition changelog, in
exactly-once form (transactions of 10,000 records, so the restore also steps over markers),
restores it with `OwnedCardHistory.restore` (what a replica runs on an assignment), prints the
figures as one JSON line and writes them to bench/results/state-restore.json. The topic is deleted
at the end.
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import time

from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from bench.harness import REPO, connect, tool_parser
from scorer.card_history_record import STATE_BYTES, STATE_VERSION
from stream.card_history_changelog import KafkaChangelog
from stream.metrics import ServiceMetrics
from stream.owned_card_history import OwnedCardHistory
from stream.startup.kafka_clients import READER_DEFAULTS

RESULTS = REPO / "bench" / "results" / "state-restore.json"
TRANSACTION_RECORDS = 10_000
#: The restore only checks the version byte and length: every card can hold the same state.
STATE = bytes([STATE_VERSION]) + bytes(STATE_BYTES - 1)


def fill(bootstrap: str, topic: str, cards: int) -> float:
    """Write `cards` card states to partition 0 of `topic`; return the seconds it took."""
    started = time.monotonic()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": topic, "linger.ms": 20}
    )
    producer.init_transactions(30)
    for first in range(0, cards, TRANSACTION_RECORDS):
        producer.begin_transaction()
        for card in range(first, min(first + TRANSACTION_RECORDS, cards)):
            while True:
                try:
                    producer.produce(topic, key=f"card-{card:08d}".encode(), value=STATE)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(60)
        if first // TRANSACTION_RECORDS % 20 == 0:
            print(
                f"wrote {min(first + TRANSACTION_RECORDS, cards):,} of {cards:,} cards", flush=True
            )
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = tool_parser("python -m bench.state_restore", __doc__)
    parser.add_argument(
        "--cards", type=int, default=1_000_000, help="cards in the partition (default 1,000,000)"
    )
    args = parser.parse_args(argv)
    if args.cards < 1:
        parser.error("--cards must be at least 1")
    broker = connect("bench.state_restore", args.bootstrap_servers)
    if broker is None:
        return 2
    try:
        topic = broker.topic("state-restore", 1)
        fill_s = fill(args.bootstrap_servers, topic, args.cards)
        registry = CollectorRegistry()
        state = OwnedCardHistory(
            KafkaChangelog({**READER_DEFAULTS, "bootstrap.servers": args.bootstrap_servers}, topic),
            time_scale=1.0,
            metrics=ServiceMetrics(registry),
        )
        # As the service does once started (stream/startup/cli.py): what is loaded by now stays
        # out of the collector's full passes, which otherwise took 1.4 of a 3.7 s restore here.
        gc.freeze()
        rss_before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.monotonic()
        state.restore([0])
        restore_s = time.monotonic() - started
        rss_after_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except RuntimeError as exc:
        print(f"bench.state_restore: {exc}", file=sys.stderr)
        return 2
    finally:
        broker.delete_topics()
    restored = registry.get_sample_value("fraud_card_state_cards")
    figures = {
        "cards": args.cards,
        "restored_cards": int(restored or 0),
        "restore_s": round(restore_s, 3),
        "cards_per_s": round(args.cards / restore_s),
        "state_mb": round((registry.get_sample_value("fraud_card_state_bytes") or 0) / 1e6, 1),
        "peak_rss_growth_mb": round((rss_after_kb - rss_before_kb) / 1024, 1),
        "fill_s": round(fill_s, 1),
    }
    print(json.dumps(figures))
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["restored_cards"] == args.cards else 1


if __name__ == "__main__":
    raise SystemExit(main())
